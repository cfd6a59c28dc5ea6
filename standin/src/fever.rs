//! FEVER stand-in: Wikipedia-style pages (PTB-tokenised intro sections, FEVER page
//! ids) and one-fact claims that each page supports or refutes.

use super::rng::Rng;
use super::text::{FIRST_NAMES, LAST_NAMES, push_sentence};

/// FEV_TOPIC labels.
pub const TOPICS: [&str; 11] = [
    "politics",
    "sports",
    "film and television",
    "music",
    "literature",
    "science",
    "history",
    "geography",
    "business",
    "religion",
    "other",
];

struct Kind {
    /// Topic index.
    topic: u8,
    person: bool,
    /// Descriptor in the lead sentence, e.g. "actor" / "city".
    nouns: &'static [&'static str],
    /// What the year means.
    year_verb: &'static str,
    /// Id suffix (FEVER escapes).
    suffix: &'static str,
}

const KINDS: &[(f64, Kind)] = &[
    (
        0.10,
        Kind {
            topic: 0,
            person: true,
            nouns: &["politician", "diplomat", "senator", "governor"],
            year_verb: "born",
            suffix: "",
        },
    ),
    (
        0.09,
        Kind {
            topic: 1,
            person: true,
            nouns: &[
                "footballer",
                "tennis player",
                "boxer",
                "basketball player",
                "cyclist",
            ],
            year_verb: "born",
            suffix: "",
        },
    ),
    (
        0.16,
        Kind {
            topic: 2,
            person: true,
            nouns: &[
                "actor",
                "actress",
                "film director",
                "screenwriter",
                "television presenter",
            ],
            year_verb: "born",
            suffix: "",
        },
    ),
    (
        0.10,
        Kind {
            topic: 3,
            person: true,
            nouns: &["singer", "songwriter", "guitarist", "composer", "rapper"],
            year_verb: "born",
            suffix: "",
        },
    ),
    (
        0.07,
        Kind {
            topic: 4,
            person: true,
            nouns: &["novelist", "poet", "playwright", "essayist"],
            year_verb: "born",
            suffix: "",
        },
    ),
    (
        0.05,
        Kind {
            topic: 5,
            person: true,
            nouns: &["physicist", "chemist", "biologist", "mathematician"],
            year_verb: "born",
            suffix: "",
        },
    ),
    (
        0.08,
        Kind {
            topic: 6,
            person: true,
            nouns: &["general", "explorer", "monarch", "revolutionary"],
            year_verb: "born",
            suffix: "",
        },
    ),
    (
        0.06,
        Kind {
            topic: 7,
            person: false,
            nouns: &["city", "town", "river", "mountain range", "island"],
            year_verb: "first mentioned",
            suffix: "",
        },
    ),
    (
        0.04,
        Kind {
            topic: 8,
            person: false,
            nouns: &["company", "retailer", "airline", "bank"],
            year_verb: "founded",
            suffix: "_Inc.",
        },
    ),
    (
        0.07,
        Kind {
            topic: 2,
            person: false,
            nouns: &["film", "television series"],
            year_verb: "released",
            suffix: "_-LRB-film-RRB-",
        },
    ),
    (
        0.03,
        Kind {
            topic: 3,
            person: false,
            nouns: &["rock band", "album", "pop group"],
            year_verb: "formed",
            suffix: "_-LRB-band-RRB-",
        },
    ),
    (
        0.03,
        Kind {
            topic: 4,
            person: false,
            nouns: &["novel", "book series"],
            year_verb: "published",
            suffix: "_-LRB-novel-RRB-",
        },
    ),
    (
        0.02,
        Kind {
            topic: 0,
            person: false,
            nouns: &["political party", "parliament"],
            year_verb: "founded",
            suffix: "_Party",
        },
    ),
    (
        0.02,
        Kind {
            topic: 6,
            person: false,
            nouns: &["battle", "treaty", "uprising"],
            year_verb: "fought",
            suffix: "_-LRB-battle-RRB-",
        },
    ),
    (
        0.02,
        Kind {
            topic: 9,
            person: false,
            nouns: &["cathedral", "religious order", "monastery"],
            year_verb: "established",
            suffix: "_Abbey",
        },
    ),
    (
        0.02,
        Kind {
            topic: 1,
            person: false,
            nouns: &["football club", "stadium"],
            year_verb: "founded",
            suffix: "_F.C.",
        },
    ),
    (
        0.02,
        Kind {
            topic: 5,
            person: false,
            nouns: &["species of beetle", "chemical compound", "genus of plants"],
            year_verb: "described",
            suffix: "_-LRB-species-RRB-",
        },
    ),
    (
        0.02,
        Kind {
            topic: 10,
            person: false,
            nouns: &["university", "museum", "video game"],
            year_verb: "opened",
            suffix: "_Institute",
        },
    ),
];

const NAME_A: &[&str] = &[
    "Silver", "Northern", "Red", "Golden", "Hidden", "Broken", "Iron", "Crystal", "Eastern",
    "Lonely", "Burning", "Quiet", "Wild", "Black", "Distant", "Hollow", "Emerald", "Frozen",
    "Royal", "Ancient", "Scarlet", "Western", "Bright", "Last", "Great", "Little", "Old", "New",
    "High", "Lower", "Upper", "Saint", "Blue", "Green", "White", "Dark", "Sunken", "Fallen",
    "Winter", "Summer",
];
const NAME_B: &[&str] = &[
    "Harbor", "River", "Valley", "Crown", "Garden", "Bridge", "Mountain", "Lake", "Forest",
    "Tower", "Meadow", "Island", "Coast", "Field", "Castle", "Road", "Hill", "Market", "Stone",
    "Rock", "Falls", "Haven", "Ridge", "Point", "Springs", "Creek", "Moor", "Gate", "Mill", "Bay",
    "Star", "Wind", "Fire", "Shadow", "Light", "Heart", "Song", "Dream", "Storm", "Horizon",
];
const NATIONALITIES: &[(&str, &str)] = &[
    ("American", "United States"),
    ("British", "United Kingdom"),
    ("French", "France"),
    ("German", "Germany"),
    ("Italian", "Italy"),
    ("Spanish", "Spain"),
    ("Canadian", "Canada"),
    ("Australian", "Australia"),
    ("Brazilian", "Brazil"),
    ("Japanese", "Japan"),
    ("Indian", "India"),
    ("Mexican", "Mexico"),
    ("Swedish", "Sweden"),
    ("Irish", "Ireland"),
    ("Polish", "Poland"),
    ("Dutch", "Netherlands"),
    ("Nigerian", "Nigeria"),
    ("Egyptian", "Egypt"),
];
const ROMAN: &[&str] = &["I", "II", "III", "IV", "V", "VI", "VII", "VIII", "IX", "X"];
const CITIES: &[&str] = &[
    "London",
    "Paris",
    "Berlin",
    "Chicago",
    "Toronto",
    "Sydney",
    "Madrid",
    "Rome",
    "Tokyo",
    "Mumbai",
    "Lagos",
    "Cairo",
    "Dublin",
    "Warsaw",
    "Amsterdam",
    "Stockholm",
    "Boston",
    "Melbourne",
    "Lyon",
    "Munich",
    "Osaka",
];

/// Planted truth of one page.
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    /// FEVER page id (`Name_With_Underscores` plus escapes).
    pub id: String,
    /// Display name (spaces, parentheses restored).
    pub name: String,
    /// The page primarily describes a person.
    pub person: bool,
    /// Topic of claims about this page.
    pub topic: u8,
    descriptor: String,
    nationality: usize,
    year: u32,
    city: usize,
    month: usize,
    day: usize,
    target_tokens: f64,
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// Page `j` (the j-th distinct page claims name).
pub fn page(j: u64) -> Page {
    let mut rng = Rng::row("evidence", j);
    let weights: Vec<f64> = KINDS.iter().map(|(w, _)| *w).collect();
    let k = &KINDS[rng.weighted(&weights)].1;
    let (name, id) = if k.person {
        let space = (FIRST_NAMES.len() * LAST_NAMES.len()) as u64;
        let p = (j.wrapping_mul(7919)) % space;
        let f = FIRST_NAMES[(p % FIRST_NAMES.len() as u64) as usize];
        let l = LAST_NAMES[(p / FIRST_NAMES.len() as u64) as usize];
        let mut name = format!("{f} {l}");
        if j >= space {
            name.push_str(&format!(
                " {}",
                ROMAN[((j / space) as usize).min(ROMAN.len() - 1)]
            ));
        }
        (name.clone(), name.replace(' ', "_"))
    } else {
        let space = (NAME_A.len() * NAME_B.len()) as u64;
        let p = (j.wrapping_mul(7919)) % space;
        let a = NAME_A[(p % NAME_A.len() as u64) as usize];
        let b = NAME_B[(p / NAME_A.len() as u64) as usize];
        let mut base = format!("{a} {b}");
        if j >= space {
            base.push_str(&format!(
                " {}",
                ROMAN[((j / space) as usize).min(ROMAN.len() - 1)]
            ));
        }
        let id = format!("{}{}", base.replace(' ', "_"), k.suffix);
        (base, id)
    };
    let descriptor = rng.pick(k.nouns).to_string();
    let year = if k.person {
        1900 + rng.below(100) as u32
    } else {
        1700 + rng.below(320) as u32
    };
    Page {
        id,
        name,
        person: k.person,
        topic: k.topic,
        descriptor,
        nationality: rng.below(NATIONALITIES.len()),
        year,
        city: rng.below(CITIES.len()),
        month: rng.below(12),
        day: rng.range(1, 28),
        target_tokens: rng.lognormal(330.0, 0.6, 30.0, 2000.0),
    }
}

const CHARS_PER_TOKEN: f64 = 4.5;

const PERSON_FILL: &[&str] = &[
    "{P} began {his} career in {city2} in the early {decade}s .",
    "{P} attended the University of {city2} , where {he} studied history and economics .",
    "In {year2} , {he} received a national award for {his} contributions to the field .",
    "{He} was married twice and had three children .",
    "{P} later moved to {city2} , where {he} lived until {his} retirement .",
    "{His} early work was influenced by the traditions of {country2} .",
    "{He} served on the boards of several charitable organizations .",
    "During the {decade}s , {he} became one of the best-known figures in {country} .",
    "A biography of {P} was published in {year2} .",
    "{He} has been the subject of several documentaries and retrospectives .",
    "{His} career spanned more than four decades .",
    "In later years , {he} devoted much of {his} time to teaching .",
];
const THING_FILL: &[&str] = &[
    "The {desc} is located near {city2} , in the northern part of {country} .",
    "In {year2} , the {desc} underwent a major reorganization .",
    "It has been described as one of the most important {desc}s in {country} .",
    "The name derives from an old local word for the surrounding landscape .",
    "Since the {decade}s , it has attracted considerable international attention .",
    "It was the subject of a detailed study published in {year2} .",
    "Several notable people have been associated with the {desc} over the years .",
    "The {desc} was badly damaged in {year2} and later restored .",
    "Its history is closely linked to the development of {city2} .",
    "Today it is administered by a foundation based in {city2} .",
];

/// Text of page `j`: a PTB-tokenised intro section stating its facts.
pub fn page_text(j: u64, p: &Page) -> String {
    let mut rng = Rng::row("evidence.text", j);
    let (nat, country) = NATIONALITIES[p.nationality];
    let target = (p.target_tokens * CHARS_PER_TOKEN) as usize;
    let mut out = String::with_capacity(target + 200);
    let ptb_name = p.name.clone();
    if p.person {
        let article = if "AEIOU".contains(&nat[..1]) {
            "an"
        } else {
            "a"
        };
        let month = MONTHS[p.month];
        let day = p.day;
        out.push_str(&format!(
            "{ptb_name} -LRB- born {month} {day} , {} -RRB- is {article} {nat} {} .",
            p.year, p.descriptor
        ));
        push_sentence(
            &mut out,
            &format!(
                "{} was born in {} , {country} .",
                p.name.split(' ').next_back().unwrap(),
                CITIES[p.city]
            ),
        );
    } else {
        push_sentence(
            &mut out,
            &format!(
                "{ptb_name} is {} {} in {country} .",
                an(&p.descriptor),
                p.descriptor
            ),
        );
        push_sentence(
            &mut out,
            &format!(
                "It was {} in {} .",
                KINDS
                    .iter()
                    .find(|(_, k)| k.nouns.contains(&p.descriptor.as_str()))
                    .map(|(_, k)| k.year_verb)
                    .unwrap_or("founded"),
                p.year
            ),
        );
    }
    let (he, his, he_c, his_c) = if p.descriptor == "actress" || (p.person && rng.chance(0.4)) {
        ("she", "her", "She", "Her")
    } else {
        ("he", "his", "He", "His")
    };
    let last = p.name.split(' ').next_back().unwrap_or("").to_string();
    let fill = if p.person { PERSON_FILL } else { THING_FILL };
    let mut order: Vec<usize> = (0..fill.len()).collect();
    rng.shuffle(&mut order);
    let mut i = 0;
    while out.len() < target {
        let t = fill[order[i % order.len()]];
        i += 1;
        let city2 = CITIES[rng.below(CITIES.len())].to_string();
        let country2 = NATIONALITIES[rng.below(NATIONALITIES.len())].1.to_string();
        let decade = (1900 + 10 * rng.below(12)).to_string();
        let year2 = (p.year as usize + 10 + rng.below(60)).to_string();
        let vars = [
            ("P", last.as_str()),
            ("he", he),
            ("his", his),
            ("He", he_c),
            ("His", his_c),
            ("city2", city2.as_str()),
            ("country2", country2.as_str()),
            ("country", country),
            ("decade", decade.as_str()),
            ("year2", year2.as_str()),
            ("desc", p.descriptor.as_str()),
        ];
        let s = super::text::expand(&mut rng, t, &vars);
        push_sentence(&mut out, &s);
    }
    out
}

/// Planted truth of one claim.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    /// Index of the page the claim names.
    pub page: usize,
    /// `SUPPORTS` (true) or `REFUTES` (false).
    pub supports: bool,
    /// About a person.
    pub about_person: bool,
    /// Contains a date or year.
    pub has_date: bool,
    /// Topic index.
    pub topic: u8,
}

/// Structure of claim `i`: a new page (`known` is its index) or one of the `known` earlier pages.
pub fn claim_struct(i: u64, known: usize, new_page: bool) -> (usize, bool) {
    let mut rng = Rng::row("claims.struct", i);
    let page = if new_page || known == 0 {
        known
    } else {
        rng.zipf(known)
    };
    (page, rng.chance(0.73))
}

/// Claim `i` about `page` (index `page_idx`): truth and text.
pub fn claim(i: u64, page_idx: usize, p: &Page, supports: bool) -> (Claim, String) {
    let mut rng = Rng::row("claims", i);
    let has_date = rng.chance(0.2);
    let (nat, country) = NATIONALITIES[p.nationality];
    let verb = KINDS
        .iter()
        .find(|(_, k)| k.nouns.contains(&p.descriptor.as_str()))
        .map(|(_, k)| k.year_verb)
        .unwrap_or("founded");
    let name = &p.name;
    let text = if has_date {
        let y = if supports {
            p.year
        } else {
            p.year + 3 + rng.below(30) as u32
        };
        if p.person {
            if rng.chance(0.5) {
                format!("{name} was born on {} {}, {y}.", MONTHS[p.month], p.day)
            } else {
                format!("{name} was born in the year {y} in {}.", CITIES[p.city])
            }
        } else {
            format!("{name} was {verb} in the year {y} in {country}.")
        }
    } else if p.person {
        match rng.below(3) {
            0 => {
                let n = if supports {
                    nat
                } else {
                    NATIONALITIES[(p.nationality + 1 + rng.below(5)) % NATIONALITIES.len()].0
                };
                let article = if "AEIOU".contains(&n[..1]) { "an" } else { "a" };
                format!("{name} is {article} {n} {} by nationality.", p.descriptor)
            }
            1 => {
                let c = if supports {
                    CITIES[p.city]
                } else {
                    CITIES[(p.city + 1 + rng.below(5)) % CITIES.len()]
                };
                format!("{name} was born in the city of {c}.")
            }
            _ => {
                let d = if supports {
                    p.descriptor.clone()
                } else {
                    other_descriptor(&p.descriptor, &mut rng)
                };
                format!("{name} worked as a professional {d}.")
            }
        }
    } else if rng.chance(0.5) {
        let c = if supports {
            country
        } else {
            NATIONALITIES[(p.nationality + 1 + rng.below(5)) % NATIONALITIES.len()].1
        };
        format!(
            "{name} is {} {} located in the country of {c}.",
            an(&p.descriptor),
            p.descriptor
        )
    } else {
        let d = if supports {
            p.descriptor.clone()
        } else {
            other_descriptor(&p.descriptor, &mut rng)
        };
        format!("{name} is best known as a {d} from {country}.")
    };
    (
        Claim {
            page: page_idx,
            supports,
            about_person: p.person,
            has_date,
            topic: p.topic,
        },
        text,
    )
}

fn an(word: &str) -> &'static str {
    if word.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    }
}

fn other_descriptor(d: &str, rng: &mut Rng) -> String {
    loop {
        let k = &KINDS[rng.below(KINDS.len())].1;
        let x = rng.pick(k.nouns);
        if x != d {
            return x.to_string();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_have_unique_ids_and_claims_name_them() {
        let mut ids = std::collections::HashSet::new();
        for j in 0..1600 {
            let p = page(j);
            assert!(ids.insert(p.id.clone()), "duplicate page id {}", p.id);
        }
        let p = page(5);
        let t = page_text(5, &p);
        assert!(t.starts_with(&p.name) && !t.contains('{'), "{t}");
        let (c, text) = claim(1, 5, &p, true);
        assert!(text.contains(&p.name));
        assert_eq!(
            c.has_date,
            text.chars().any(|ch| ch.is_ascii_digit()),
            "{text}"
        );
    }
}
