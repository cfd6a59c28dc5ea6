//! Template expansion shared by the genre generators.
//!
//! A template is plain text with `{slot}` markers. A slot is filled from the
//! caller's bindings first, then from the shared word lists below; an unknown slot
//! is left as written (tests catch that).

use super::rng::Rng;

/// Expands `{slot}` markers of `tmpl` into `out`.
pub fn expand_into(out: &mut String, rng: &mut Rng, tmpl: &str, vars: &[(&str, &str)]) {
    let mut rest = tmpl;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let Some(close) = after.find('}') else {
            out.push_str(&rest[open..]);
            return;
        };
        let name = &after[..close];
        if let Some((_, v)) = vars.iter().find(|(k, _)| *k == name) {
            out.push_str(v);
        } else if let Some(list) = words(name) {
            out.push_str(rng.pick(list));
        } else {
            out.push('{');
            out.push_str(name);
            out.push('}');
        }
        rest = &after[close + 1..];
    }
    out.push_str(rest);
}

/// Expands a template into a new string.
pub fn expand(rng: &mut Rng, tmpl: &str, vars: &[(&str, &str)]) -> String {
    let mut s = String::with_capacity(tmpl.len() + 32);
    expand_into(&mut s, rng, tmpl, vars);
    s
}

/// Appends a sentence (separated by one space unless at the start of a paragraph).
pub fn push_sentence(out: &mut String, s: &str) {
    if !out.is_empty() && !out.ends_with(' ') && !out.ends_with('\n') && !out.ends_with('>') {
        out.push(' ');
    }
    out.push_str(s);
}

/// Upper-cases the first letter.
pub fn capitalize(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().collect::<String>() + c.as_str(),
        None => String::new(),
    }
}

/// A person's name: first and last name from the shared lists.
pub fn person_name(rng: &mut Rng) -> String {
    format!("{} {}", rng.pick(FIRST_NAMES), rng.pick(LAST_NAMES))
}

pub const FIRST_NAMES: &[&str] = &[
    "James",
    "Mary",
    "Robert",
    "Patricia",
    "John",
    "Jennifer",
    "Michael",
    "Linda",
    "David",
    "Elizabeth",
    "William",
    "Barbara",
    "Richard",
    "Susan",
    "Joseph",
    "Jessica",
    "Thomas",
    "Sarah",
    "Charles",
    "Karen",
    "Daniel",
    "Nancy",
    "Matthew",
    "Lisa",
    "Anthony",
    "Margaret",
    "Mark",
    "Sandra",
    "Donald",
    "Ashley",
    "Steven",
    "Emily",
    "Paul",
    "Donna",
    "Andrew",
    "Michelle",
    "Joshua",
    "Carol",
    "Kenneth",
    "Amanda",
    "Kevin",
    "Melissa",
    "Brian",
    "Deborah",
    "George",
    "Stephanie",
    "Edward",
    "Rebecca",
    "Ronald",
    "Laura",
    "Timothy",
    "Helen",
    "Jason",
    "Sharon",
    "Jeffrey",
    "Cynthia",
    "Ryan",
    "Kathleen",
    "Jacob",
    "Amy",
    "Gary",
    "Shirley",
    "Nicholas",
    "Angela",
    "Eric",
    "Anna",
    "Jonathan",
    "Ruth",
    "Stephen",
    "Brenda",
    "Larry",
    "Pamela",
    "Justin",
    "Nicole",
    "Scott",
    "Katherine",
    "Brandon",
    "Virginia",
    "Frank",
    "Catherine",
    "Gregory",
    "Christine",
    "Raymond",
    "Samantha",
    "Samuel",
    "Debra",
    "Patrick",
    "Janet",
    "Alexander",
    "Rachel",
    "Jack",
    "Carolyn",
    "Dennis",
    "Emma",
    "Jerry",
    "Maria",
    "Tyler",
    "Heather",
    "Aaron",
    "Diane",
    "Henry",
    "Julie",
    "Walter",
    "Joyce",
    "Peter",
    "Evelyn",
    "Harold",
    "Frances",
    "Douglas",
    "Joan",
    "Carl",
    "Christina",
    "Arthur",
    "Kelly",
    "Lawrence",
    "Victoria",
    "Roger",
    "Lauren",
    "Albert",
    "Martha",
    "Marco",
    "Ingrid",
    "Pierre",
    "Sofia",
    "Hans",
    "Yuki",
    "Rajesh",
    "Mei",
    "Olusegun",
    "Camille",
];

pub const LAST_NAMES: &[&str] = &[
    "Smith",
    "Johnson",
    "Williams",
    "Brown",
    "Jones",
    "Garcia",
    "Miller",
    "Davis",
    "Rodriguez",
    "Martinez",
    "Hernandez",
    "Lopez",
    "Wilson",
    "Anderson",
    "Thomas",
    "Taylor",
    "Moore",
    "Jackson",
    "Martin",
    "Lee",
    "Thompson",
    "White",
    "Harris",
    "Clark",
    "Lewis",
    "Robinson",
    "Walker",
    "Young",
    "Allen",
    "King",
    "Wright",
    "Scott",
    "Torres",
    "Hill",
    "Green",
    "Adams",
    "Nelson",
    "Baker",
    "Hall",
    "Campbell",
    "Mitchell",
    "Carter",
    "Roberts",
    "Phillips",
    "Evans",
    "Turner",
    "Parker",
    "Collins",
    "Edwards",
    "Stewart",
    "Morris",
    "Murphy",
    "Cook",
    "Rogers",
    "Morgan",
    "Cooper",
    "Peterson",
    "Reed",
    "Bailey",
    "Bell",
    "Kelly",
    "Howard",
    "Ward",
    "Cox",
    "Richardson",
    "Wood",
    "Watson",
    "Brooks",
    "Bennett",
    "Gray",
    "Hughes",
    "Price",
    "Sanders",
    "Myers",
    "Long",
    "Ross",
    "Foster",
    "Powell",
    "Jenkins",
    "Perry",
    "Russell",
    "Sullivan",
    "Fisher",
    "Hamilton",
    "Graham",
    "Wallace",
    "Hayes",
    "Gibson",
    "Ellis",
    "Stone",
    "Harlan",
    "Whitaker",
    "Delacroix",
    "Lindqvist",
    "Okafor",
    "Brennan",
    "Castellano",
    "Novak",
    "Haddad",
    "Moreau",
    "Kowalski",
    "Fontaine",
    "Ashford",
    "Blackwood",
    "Carrington",
    "Delgado",
    "Eriksen",
    "Fairbanks",
    "Galloway",
    "Hargrove",
];

/// Shared word lists (slot name → choices).
pub fn words(name: &str) -> Option<&'static [&'static str]> {
    Some(match name {
        "friend" => &[
            "my wife",
            "my husband",
            "a friend from work",
            "my brother",
            "my sister",
            "my roommate",
            "my dad",
            "my mother",
            "two friends",
            "my girlfriend",
            "my boyfriend",
            "my kids",
            "a coworker",
            "my cousin",
            "an old college friend",
            "my neighbor",
        ],
        "when" => &[
            "last night",
            "over the weekend",
            "on a rainy Sunday afternoon",
            "on a long flight",
            "late one night",
            "last week",
            "a few years ago",
            "on opening night",
            "this morning",
            "during a snowstorm",
            "on a slow Tuesday",
            "after a long day at work",
            "on New Year's Eve",
        ],
        "where" => &[
            "at a small art-house theater",
            "on cable",
            "on DVD",
            "on a streaming service",
            "at a film festival",
            "at a drive-in",
            "at the local multiplex",
            "on an old VHS tape",
            "on a late-night TV broadcast",
            "at a midnight screening",
            "in a half-empty theater",
        ],
        "city" => &[
            "Boston",
            "Chicago",
            "Lisbon",
            "Vienna",
            "Osaka",
            "Denver",
            "Marseille",
            "Krakow",
            "Melbourne",
            "Toronto",
            "Seattle",
            "Naples",
            "Glasgow",
            "Austin",
            "Prague",
            "Dublin",
            "Baltimore",
            "Tucson",
            "Hamburg",
            "Montreal",
            "Cleveland",
            "Nairobi",
            "Lagos",
            "Lima",
        ],
        "country" => &[
            "France",
            "Germany",
            "Brazil",
            "Japan",
            "Canada",
            "Australia",
            "Italy",
            "Spain",
            "Norway",
            "Kenya",
            "India",
            "Mexico",
            "Poland",
            "Ireland",
            "Chile",
            "Egypt",
            "Sweden",
            "Portugal",
        ],
        "pos_adj" => &[
            "excellent",
            "wonderful",
            "superb",
            "terrific",
            "outstanding",
            "remarkable",
            "fantastic",
            "brilliant",
            "impressive",
            "strong",
            "memorable",
            "beautiful",
            "first-rate",
            "top-notch",
        ],
        "neg_adj" => &[
            "terrible",
            "awful",
            "weak",
            "dreadful",
            "poor",
            "lazy",
            "clumsy",
            "sloppy",
            "bland",
            "painful",
            "forgettable",
            "embarrassing",
            "lifeless",
            "mediocre",
            "amateurish",
        ],
        "mild_adj" => &[
            "decent",
            "serviceable",
            "competent",
            "adequate",
            "passable",
            "unremarkable",
            "fine",
            "acceptable",
            "workmanlike",
            "ordinary",
        ],
        "year" => &[
            "1962", "1971", "1978", "1983", "1987", "1991", "1994", "1997", "1999", "2001", "2003",
            "2005", "2006", "2008", "2009",
        ],
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_bindings_and_lists() {
        let mut r = Rng::row("t", 0);
        let s = expand(
            &mut r,
            "I saw it {when} with {who} in {city}.",
            &[("who", "Ann")],
        );
        assert!(s.contains("Ann") && !s.contains('{'), "{s}");
        assert_eq!(expand(&mut r, "{nope}", &[]), "{nope}");
    }
}
