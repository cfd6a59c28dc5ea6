//! IMDB stand-in: movie reviews with planted sentiment, genre, aspects, ending,
//! named actors and main complaint.

use super::rng::Rng;
use super::text::{capitalize, expand, person_name, push_sentence};

/// The 12 published aspects, in id order `as0`…`as11` (SPEC §C).
pub const ASPECTS: [&str; 12] = [
    "the acting",
    "the plot",
    "the directing",
    "the cinematography",
    "the soundtrack",
    "the pacing",
    "the ending",
    "the dialogue",
    "the special effects",
    "the character development",
    "the screenplay",
    "the editing",
];
/// Index of `the ending` in [`ASPECTS`].
pub const ENDING: usize = 6;

/// Sentiment labels (IMDB_SENTIMENT / IMDB_ASPECT_SENTIMENT order).
pub const SENTIMENTS: [&str; 4] = ["positive", "negative", "neutral", "mixed"];
const POS: u8 = 0;
const NEG: u8 = 1;
const NEU: u8 = 2;
const MIX: u8 = 3;

/// IMDB_GENRE labels.
pub const GENRES: [&str; 21] = [
    "action",
    "adventure",
    "animation",
    "biography",
    "comedy",
    "crime",
    "documentary",
    "drama",
    "family",
    "fantasy",
    "history",
    "horror",
    "music",
    "musical",
    "mystery",
    "romance",
    "sci-fi",
    "sport",
    "thriller",
    "war",
    "western",
];
const GENRE_WEIGHTS: [f64; 21] = [
    10.0, 3.0, 2.0, 1.5, 15.0, 4.0, 2.0, 25.0, 2.0, 2.0, 1.0, 10.0, 1.0, 1.0, 2.0, 6.0, 4.0, 1.0,
    6.0, 2.0, 1.5,
];

/// IMDB_COMPLAINT labels.
pub const COMPLAINTS: [&str; 8] = [
    "poor acting",
    "poor writing",
    "poor visual effects",
    "slow pacing",
    "weak ending",
    "too long",
    "too violent",
    "no specific complaint",
];
const NO_COMPLAINT: u8 = 7;

/// Planted truth of one review.
#[derive(Debug, Clone, PartialEq)]
pub struct Review {
    /// Overall sentiment (index into [`SENTIMENTS`]).
    pub sentiment: u8,
    /// Genre (index into [`GENRES`]).
    pub genre: u8,
    /// Per aspect: `None` = not discussed, else the sentiment about it.
    pub aspects: [Option<u8>; 12],
    /// A specific actor or actress is named.
    pub actor_named: bool,
    /// Main complaint (index into [`COMPLAINTS`]).
    pub complaint: u8,
}

impl Review {
    /// F1: at least one positive aspect is mentioned (a positive or mixed aspect).
    pub fn positive_aspect(&self) -> bool {
        self.aspects
            .iter()
            .any(|a| matches!(a, Some(POS) | Some(MIX)))
    }
    /// F4: the ending is discussed.
    pub fn discusses_ending(&self) -> bool {
        self.aspects[ENDING].is_some()
    }
}

/// Approximate characters per Qwen3 token of this prose (calibrated with the tokenizer).
const CHARS_PER_TOKEN: f64 = 4.45;

fn subjects(aspect: usize) -> &'static [&'static str] {
    match aspect {
        0 => &[
            "the acting",
            "the performances",
            "the acting across the board",
            "the cast's work",
        ],
        1 => &["the plot", "the story", "the storyline", "the plot itself"],
        2 => &[
            "the directing",
            "the direction",
            "the director's handling of the material",
        ],
        3 => &[
            "the cinematography",
            "the camera work",
            "the photography",
            "the visual composition",
        ],
        4 => &[
            "the soundtrack",
            "the score",
            "the music",
            "the musical score",
        ],
        5 => &["the pacing", "the pace", "the rhythm of the film"],
        6 => &[
            "the ending",
            "the final act",
            "the last twenty minutes",
            "the climax",
        ],
        7 => &[
            "the dialogue",
            "the dialog",
            "the lines these characters speak",
        ],
        8 => &[
            "the special effects",
            "the effects work",
            "the CGI",
            "the visual effects",
        ],
        9 => &[
            "the character development",
            "the characterization",
            "the way the characters grow",
        ],
        10 => &["the screenplay", "the script", "the writing"],
        _ => &["the editing", "the cutting", "the way the film is edited"],
    }
}

fn detail(aspect: usize, sentiment: u8) -> &'static [&'static str] {
    let good = sentiment == POS;
    match (aspect, good) {
        (0, true) => &[
            "every actor seems to understand exactly who their character is",
            "even the smallest roles are played with conviction",
        ],
        (0, false) => &[
            "half the cast seems to be reading off cue cards",
            "nobody seems to believe a word they are saying",
        ],
        (1, true) => &[
            "each twist is earned and the stakes keep rising",
            "it keeps you guessing without ever cheating",
        ],
        (1, false) => &[
            "it is full of holes and coincidences",
            "you can predict every turn twenty minutes in advance",
        ],
        (2, true) => &[
            "every scene feels deliberate and controlled",
            "the tone never wobbles",
        ],
        (2, false) => &[
            "scenes just sit there with no sense of purpose",
            "the tone lurches from scene to scene",
        ],
        (3, true) => &[
            "nearly every frame could hang on a wall",
            "the use of natural light is gorgeous",
        ],
        (3, false) => &[
            "everything looks flat and murky",
            "the shaky camera makes it hard to follow anything",
        ],
        (4, true) => &[
            "the music lifts every key scene",
            "I went looking for the score the moment I got home",
        ],
        (4, false) => &[
            "the music tells you what to feel in every scene",
            "the songs are loud and completely out of place",
        ],
        (5, true) => &[
            "not a minute feels wasted",
            "it moves briskly and never drags",
        ],
        (5, false) => &[
            "the middle hour drags terribly",
            "it crawls along and then rushes at the worst moments",
        ],
        (6, true) => &[
            "the final scene recontextualizes everything that came before",
            "the way it all wraps up is both surprising and satisfying",
        ],
        (6, false) => &[
            "the ending comes out of nowhere and resolves nothing",
            "the final scene feels like the writers simply ran out of ideas",
        ],
        (7, true) => &[
            "the conversations sound like real people talking",
            "several lines are quotable",
        ],
        (7, false) => &[
            "the lines are stiff and full of exposition",
            "people talk like greeting cards",
        ],
        (8, true) => &[
            "the effects hold up even on a big screen",
            "the creatures look completely real",
        ],
        (8, false) => &[
            "the effects look like an unfinished video game",
            "the green-screen work is painfully obvious",
        ],
        (9, true) => &[
            "the characters change in ways that feel natural",
            "you really see the lead grow over the course of the story",
        ],
        (9, false) => &[
            "nobody changes at all from the first scene to the last",
            "the characters are little more than cardboard cutouts",
        ],
        (10, true) => &[
            "the script is smart and economical",
            "the screenplay balances humor and tension well",
        ],
        (10, false) => &[
            "the script feels like a first draft",
            "the screenplay is a pile of clichés",
        ],
        (_, true) => &[
            "the cuts are sharp and the transitions clever",
            "the editing gives the action real clarity",
        ],
        (_, false) => &[
            "the editing is choppy and confusing",
            "scenes are cut off before they land",
        ],
    }
}

const POS_TMPL: &[&str] = &[
    "I thought {subj} was {pos_adj}; {detail}.",
    "{Subj} is {pos_adj}, and {detail}.",
    "What really impressed me was {subj}: {detail}.",
    "{Subj} deserves special praise, because {detail}.",
    "I have to mention {subj}, which is {pos_adj} - {detail}.",
];
const NEG_TMPL: &[&str] = &[
    "{Subj} is {neg_adj}; {detail}.",
    "I found {subj} {neg_adj}, and {detail}.",
    "The biggest letdown is {subj}: {detail}.",
    "Sadly, {subj} is {neg_adj} - {detail}.",
    "Then there is {subj}, which is just {neg_adj}; {detail}.",
];
const NEU_TMPL: &[&str] = &[
    "{Subj} is {mild_adj}, nothing more and nothing less.",
    "As for {subj}, it is {mild_adj} and does its job without standing out.",
    "I don't have strong feelings about {subj}; it is {mild_adj}.",
];
const MIX_TMPL: &[&str] = &[
    "{Subj} is a mixed bag: at times it is {pos_adj}, but {neg_detail}.",
    "I went back and forth on {subj}; {pos_detail}, yet {neg_detail}.",
    "{Subj} has its moments, since {pos_detail}, but then {neg_detail}.",
];

const ACTOR_POS: &[&str] = &[
    "{actor} is {pos_adj} as the {role}, and {detail}.",
    "{actor} gives a {pos_adj} performance as the {role}; {detail}.",
    "The acting is {pos_adj}, especially {actor} as the {role}, and {detail}.",
];
const ACTOR_NEG: &[&str] = &[
    "{actor} is {neg_adj} as the {role}, and {detail}.",
    "{actor} gives a {neg_adj} performance as the {role}; {detail}.",
    "The acting is {neg_adj}, especially {actor} as the {role}, and {detail}.",
];
const ACTOR_MENTION: &[&str] = &[
    "It was a little strange to see {actor} in a small part as the {role}.",
    "I mostly watched it because {actor} is in it.",
    "{actor} turns up for a few scenes as the {role}.",
];

const ROLES: &[&str] = &[
    "detective",
    "widowed father",
    "young nurse",
    "ship's captain",
    "small-town sheriff",
    "con artist",
    "retired boxer",
    "grieving mother",
    "rookie cop",
    "villain",
    "journalist",
    "school teacher",
    "scientist",
    "farmer",
    "bank robber",
    "princess",
    "soldier",
    "lawyer",
    "drifter",
    "old mentor",
];

fn premises(genre: usize) -> &'static [&'static str] {
    match genre {
        0 => &[
            "The story follows a {role} who has to stop a gang of arms dealers before they flee {city}.",
            "It is an action movie about a heist that goes wrong in the middle of {city}.",
        ],
        1 => &[
            "The story follows a {role} who sets out across {country} to find a lost map.",
            "It is an adventure about a group of friends searching for a sunken ship.",
        ],
        2 => &[
            "It is an animated film about a young fox who wants to become a painter.",
            "This animated feature follows a robot who wakes up alone in an abandoned toy factory.",
        ],
        3 => &[
            "It is a biopic about a famous {role} who grew up poor in {city}.",
            "The film tells the true life story of a jazz trumpeter from {city}.",
        ],
        4 => &[
            "It is a comedy about two brothers who accidentally inherit a failing hotel.",
            "The setup is pure comedy: a {role} pretends to be a wedding planner to pay off a debt.",
        ],
        5 => &[
            "It is a crime story about a {role} trying to bring down a mob boss in {city}.",
            "The film follows a crew of thieves planning one last job in {city}.",
        ],
        6 => &[
            "This documentary follows a group of fishermen on the coast of {country}.",
            "It is a documentary about the last independent bookstore in {city}.",
        ],
        7 => &[
            "It is a family drama about a {role} returning home to {city} after twenty years.",
            "The drama centers on a {role} whose marriage falls apart after a tragedy.",
        ],
        8 => &[
            "It is a family film about a boy and his dog who get lost on a camping trip.",
            "The movie is meant for the whole family: three kids try to save their town's old carnival.",
        ],
        9 => &[
            "It is a fantasy tale about a young {role} who discovers a hidden kingdom under the sea.",
            "The fantasy world here is full of dragons, curses and a wizard who has lost his memory.",
        ],
        10 => &[
            "It is a historical drama set during the siege of {city} in the 1600s.",
            "The film recreates the building of the great canal in {country} in the nineteenth century.",
        ],
        11 => &[
            "It is a horror movie about a family that moves into a farmhouse where something lives in the walls.",
            "The horror starts when a group of teenagers find an old tape in the basement of a cabin.",
        ],
        12 => &[
            "The movie follows a struggling punk band on a disastrous tour across {country}.",
            "It is about a cellist from {city} preparing for the audition of her life.",
        ],
        13 => &[
            "It is a big old-fashioned musical where the characters burst into song every few minutes.",
            "This musical follows a troupe of dancers trying to save their theater in {city}.",
        ],
        14 => &[
            "It is a mystery about a {role} investigating a disappearance at a remote lighthouse.",
            "The mystery centers on a stolen painting and a house full of suspects.",
        ],
        15 => &[
            "It is a romance about two strangers who keep meeting on the same train to {city}.",
            "The romance between a {role} and a florist drives the whole story.",
        ],
        16 => &[
            "It is a science fiction film about a crew sent to investigate a signal from a frozen moon.",
            "The sci-fi premise is that people can trade memories like currency.",
        ],
        17 => &[
            "It is a sports movie about an underdog hockey team from a tiny mining town.",
            "The film follows an aging tennis player attempting one final comeback.",
        ],
        18 => &[
            "It is a thriller about a {role} who witnesses a murder from a hotel window in {city}.",
            "The thriller follows a woman who realizes the man she married is not who he claims to be.",
        ],
        19 => &[
            "It is a war film about a platoon trapped behind enemy lines in the winter of 1944.",
            "The movie follows a field hospital during the war, seen through the eyes of a young {role}.",
        ],
        _ => &[
            "It is a western about a {role} who rides into a dusty frontier town to settle an old score.",
            "The western follows a cattle drive across the plains and a feud between two families.",
        ],
    }
}

const OPENERS: [&[&str]; 4] = [
    &[
        "I really enjoyed this one.",
        "What a pleasant surprise this movie turned out to be.",
        "This is one of the better films I have seen this year.",
        "I loved this movie from start to finish.",
    ],
    &[
        "I really wanted to like this movie, but I could not.",
        "What a waste of two hours.",
        "This is one of the worst films I have seen in a long time.",
        "I can't believe how disappointing this was.",
    ],
    &[
        "This is a hard movie to have strong feelings about.",
        "I came out of this one feeling fairly indifferent.",
        "This is an average film in almost every respect.",
    ],
    &[
        "I have mixed feelings about this movie.",
        "There is a lot to like here, and a lot that does not work.",
        "This one is a real mixed bag.",
    ],
];
const CLOSERS: [&[&str]; 4] = [
    &[
        "Highly recommended. 9/10.",
        "Go see it, you won't regret it. 8/10.",
        "I will definitely watch it again. 10/10.",
        "Easily worth your time. 8 out of 10.",
    ],
    &[
        "Avoid this one. 2/10.",
        "Save your money. 1/10.",
        "I can't recommend it to anyone. 3/10.",
        "Skip it. 2 out of 10.",
    ],
    &[
        "Worth a look if nothing else is on. 5/10.",
        "It's fine for a quiet evening. 5/10.",
        "Take it or leave it. 6/10.",
    ],
    &[
        "Worth watching once, with lowered expectations. 6/10.",
        "Some will love it, some will hate it. 5/10.",
        "Good in parts, frustrating in others. 6/10.",
    ],
];
const FILLERS: &[&str] = &[
    "I watched it {when} with {friend} {where}.",
    "My expectations going in were fairly low, since I had heard very little about it.",
    "I had read a few reviews beforehand, which is something I usually try to avoid.",
    "{Friend} had been telling me to see it for months.",
    "I grew up near {city}, so some of the locations looked familiar.",
    "It reminded me a little of the films my father used to rent {when_old}.",
    "I ended up talking about it with {friend} for a good hour afterwards.",
    "The trailer had given me a completely different idea of what this would be.",
    "I remember the posters for it all over {city} when it came out in {year}.",
    "There was a lot of buzz about it at the time, most of which I ignored.",
    "I am not usually a fan of this kind of movie, so take my opinion with a grain of salt.",
    "I have seen a lot of films in this genre over the years.",
    "Some people in the audience clearly had a great time, others left early.",
    "I bought the DVD at a garage sale for a dollar and finally got around to it {when}.",
    "It was recommended to me by {friend}, who has pretty good taste.",
    "It was made on what looks like a modest budget, which is worth keeping in mind.",
    "This was my second viewing; the first was {when_old} {where}.",
    "I know that a lot of people consider this a classic, and I understand why.",
    "The opening minutes set up the situation quickly and efficiently.",
    "A couple of scenes were shot in {country}, which gives it an unusual flavor.",
    "There is a subplot involving a {role} and a missing letter that I won't spoil.",
    "The central relationship is between a {role} and a {role2}.",
    "The film runs a little under two hours.",
    "It was released in {year} and mostly forgotten since.",
];
const GENRE_NOTES: &[&str] = &[
    "As a {genre} film, it sticks closely to the rules of the genre.",
    "Fans of {genre} movies will know what to expect here.",
    "It is a {genre} picture through and through.",
    "I have always had a soft spot for {genre} movies.",
];
const TOO_LONG: &[&str] = &[
    "My biggest complaint is that it is simply too long: at close to three hours, it overstays its welcome by a wide margin.",
    "Above all, it is far too long; there is easily forty minutes that should have been cut.",
];
const TOO_VIOLENT: &[&str] = &[
    "My biggest complaint is the violence, which is relentless and gratuitous, with gore that serves no purpose.",
    "Above all, it is far too violent; the brutal torture scenes are hard to sit through and add nothing.",
];
const MAIN_COMPLAINT: &[&str] = &[
    "If I had to name the main problem, it would be {subj}.",
    "More than anything else, it is {subj} that sinks it.",
    "My biggest issue, though, remains {subj}.",
];

fn complaint_of(aspect: usize) -> Option<u8> {
    match aspect {
        0 => Some(0),
        1 | 7 | 9 | 10 => Some(1),
        3 | 8 => Some(2),
        5 | 11 => Some(3),
        6 => Some(4),
        _ => None,
    }
}

const ASPECT_WEIGHTS: [f64; 12] = [1.6, 1.6, 1.0, 0.8, 0.7, 0.7, 0.85, 0.8, 0.6, 0.8, 0.8, 0.5];

/// Generates review `i`: planted truth and text.
pub fn review(i: u64) -> (Review, String) {
    let mut rng = Rng::row("reviews", i);
    let target_tokens = rng.lognormal(218.0, 0.74, 25.0, 3100.0);
    let target_chars = (target_tokens * CHARS_PER_TOKEN) as usize;
    let sentiment = rng.weighted(&[0.44, 0.36, 0.07, 0.13]) as u8;
    let genre = rng.weighted(&GENRE_WEIGHTS) as u8;
    let k = ((target_tokens / 70.0) * (0.6 + 0.8 * rng.f64()))
        .round()
        .clamp(1.0, 9.0) as usize;
    // Choose k distinct aspects by weight.
    let mut weights = ASPECT_WEIGHTS;
    let mut chosen = Vec::with_capacity(k);
    for _ in 0..k {
        let a = rng.weighted(&weights);
        weights[a] = 0.0;
        chosen.push(a);
    }
    let dist: [f64; 4] = match sentiment {
        POS => [0.86, 0.04, 0.03, 0.07],
        NEG => [0.2, 0.68, 0.06, 0.06],
        NEU => [0.25, 0.2, 0.45, 0.1],
        _ => [0.45, 0.35, 0.05, 0.15],
    };
    let mut aspects = [None; 12];
    for &a in &chosen {
        aspects[a] = Some(rng.weighted(&dist) as u8);
    }
    let actor_named = rng.chance(0.57);
    let actor = person_name(&mut rng);
    let role = rng.pick(ROLES);
    let mut role2 = rng.pick(ROLES);
    while role2 == role {
        role2 = rng.pick(ROLES);
    }
    // Main complaint.
    let mut complaint = NO_COMPLAINT;
    let mut complaint_aspect = None;
    if sentiment == NEG || sentiment == MIX || (sentiment == NEU && rng.chance(0.5)) {
        let x = rng.f64();
        if x < 0.12 {
            complaint = 5;
        } else if x < 0.2 {
            complaint = 6;
        } else if let Some(&a) = chosen
            .iter()
            .find(|&&a| aspects[a] == Some(NEG) && complaint_of(a).is_some())
        {
            complaint = complaint_of(a).unwrap();
            complaint_aspect = Some(a);
        }
    }

    let genre_name = GENRES[genre as usize];
    let mut paragraphs: Vec<String> = Vec::new();
    let mut p = String::new();
    let vars_base = |extra: &[(&'static str, String)]| -> Vec<(&'static str, String)> {
        let mut v: Vec<(&'static str, String)> = vec![
            ("role", role.to_string()),
            ("role2", role2.to_string()),
            ("genre", genre_name.to_string()),
            ("when_old", "years ago".to_string()),
            ("actor", actor.clone()),
        ];
        v.extend(extra.iter().cloned());
        v
    };
    let exp = |rng: &mut Rng, t: &str, extra: &[(&'static str, String)]| -> String {
        let v = vars_base(extra);
        let refs: Vec<(&str, &str)> = v.iter().map(|(k, s)| (*k, s.as_str())).collect();
        let mut s = expand(rng, t, &refs);
        if s.contains("{Friend}") {
            let f = capitalize(rng.pick(super::text::words("friend").unwrap()));
            s = s.replace("{Friend}", &f);
        }
        s
    };
    push_sentence(&mut p, rng.pick(OPENERS[sentiment as usize]));
    let t = rng.pick(premises(genre as usize));
    let prem = exp(&mut rng, t, &[]);
    push_sentence(&mut p, &prem);
    if rng.chance(0.5) {
        let t = rng.pick(GENRE_NOTES);
        let g = exp(&mut rng, t, &[]);
        push_sentence(&mut p, &g);
    }
    paragraphs.push(std::mem::take(&mut p));
    // Aspect sentences.
    let mut actor_done = false;
    for &a in &chosen {
        let s = aspects[a].unwrap();
        let subj = rng.pick(subjects(a));
        let det = |rng: &mut Rng, s: u8| -> String { rng.pick(detail(a, s)).to_string() };
        let sentence = if a == 0 && actor_named && (s == POS || s == NEG) {
            actor_done = true;
            let t = if s == POS {
                rng.pick(ACTOR_POS)
            } else {
                rng.pick(ACTOR_NEG)
            };
            let d = det(&mut rng, s);
            exp(&mut rng, t, &[("detail", d)])
        } else {
            let t = match s {
                POS => rng.pick(POS_TMPL),
                NEG => rng.pick(NEG_TMPL),
                NEU => rng.pick(NEU_TMPL),
                _ => rng.pick(MIX_TMPL),
            };
            let d = det(&mut rng, if s == MIX { POS } else { s });
            let pd = det(&mut rng, POS);
            let nd = det(&mut rng, NEG);
            exp(
                &mut rng,
                t,
                &[
                    ("subj", subj.to_string()),
                    ("Subj", capitalize(subj)),
                    ("detail", d),
                    ("pos_detail", pd),
                    ("neg_detail", nd),
                ],
            )
        };
        push_sentence(&mut p, &sentence);
        if p.len() > 350 && rng.chance(0.5) {
            paragraphs.push(std::mem::take(&mut p));
        }
    }
    if actor_named && !actor_done {
        let t = rng.pick(ACTOR_MENTION);
        let s = exp(&mut rng, t, &[]);
        push_sentence(&mut p, &s);
    }
    match complaint {
        5 => push_sentence(&mut p, rng.pick(TOO_LONG)),
        6 => push_sentence(&mut p, rng.pick(TOO_VIOLENT)),
        _ => {
            if let Some(a) = complaint_aspect
                && rng.chance(0.7)
            {
                let subj = rng.pick(subjects(a));
                let t = rng.pick(MAIN_COMPLAINT);
                let s = exp(&mut rng, t, &[("subj", subj.to_string())]);
                push_sentence(&mut p, &s);
            }
        }
    }
    if !p.is_empty() {
        paragraphs.push(std::mem::take(&mut p));
    }
    // Neutral filler up to the target length.
    let closer = rng.pick(CLOSERS[sentiment as usize]);
    let mut total: usize = paragraphs.iter().map(|x| x.len() + 13).sum::<usize>() + closer.len();
    let mut filler = String::new();
    let mut order: Vec<usize> = (0..FILLERS.len()).collect();
    rng.shuffle(&mut order);
    let mut fi = 0;
    while total < target_chars {
        let t = FILLERS[order[fi % order.len()]];
        fi += 1;
        let s = exp(&mut rng, t, &[]);
        total += s.len() + 1;
        push_sentence(&mut filler, &s);
        if filler.len() > 400 && rng.chance(0.4) {
            let at = 1 + rng.below(paragraphs.len());
            paragraphs.insert(at.min(paragraphs.len()), std::mem::take(&mut filler));
        }
    }
    if !filler.is_empty() {
        let at = 1 + rng.below(paragraphs.len());
        paragraphs.insert(at.min(paragraphs.len()), filler);
    }
    // Closing verdict joins the last paragraph.
    if let Some(last) = paragraphs.last_mut() {
        push_sentence(last, closer);
    }
    let sep = if rng.chance(0.6) { "<br /><br />" } else { " " };
    let text = paragraphs.join(sep);
    (
        Review {
            sentiment,
            genre,
            aspects,
            actor_named,
            complaint,
        },
        text,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reviews_are_deterministic_and_plant_their_truth() {
        let (a, ta) = review(3);
        let (b, tb) = review(3);
        assert_eq!(a, b);
        assert_eq!(ta, tb);
        let n = 2000;
        let (mut f1, mut f4, mut f5, mut disc, mut pos) = (0, 0, 0, 0, 0);
        for i in 0..n {
            let (r, t) = review(i);
            assert!(!t.contains('{'), "unexpanded slot in review {i}: {t}");
            f1 += r.positive_aspect() as usize;
            f4 += r.discusses_ending() as usize;
            f5 += r.actor_named as usize;
            disc += r.aspects.iter().filter(|a| a.is_some()).count();
            pos += r.aspects.iter().filter(|a| **a == Some(POS)).count();
            if r.discusses_ending() {
                assert!(
                    ["ending", "final", "climax", "last twenty"]
                        .iter()
                        .any(|w| t.contains(w)),
                    "{t}"
                );
            }
        }
        let rate = |x: usize, d: usize| x as f64 / d as f64;
        assert!(
            (0.72..0.88).contains(&rate(f1, n as usize)),
            "F1 {}",
            rate(f1, n as usize)
        );
        assert!(
            (0.18..0.34).contains(&rate(f4, n as usize)),
            "F4 {}",
            rate(f4, n as usize)
        );
        assert!(
            (0.5..0.64).contains(&rate(f5, n as usize)),
            "F5 {}",
            rate(f5, n as usize)
        );
        assert!(
            (0.25..0.36).contains(&rate(disc, 12 * n as usize)),
            "discuss {}",
            rate(disc, 12 * n as usize)
        );
        assert!(
            (0.12..0.2).contains(&rate(pos, 12 * n as usize)),
            "pos {}",
            rate(pos, 12 * n as usize)
        );
    }
}
