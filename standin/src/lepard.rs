//! LePaRD stand-in: court-opinion excerpts (destination contexts) and the precedent
//! passages they cite.

use super::rng::Rng;
use super::text::{LAST_NAMES, expand, push_sentence};

/// LEP_AREA labels.
pub const AREAS: [&str; 15] = [
    "constitutional law",
    "criminal law",
    "civil procedure",
    "civil rights",
    "contracts",
    "torts",
    "property",
    "administrative law",
    "employment law",
    "intellectual property",
    "tax law",
    "family law",
    "immigration law",
    "bankruptcy",
    "antitrust",
];
const AREA_WEIGHTS: [f64; 15] = [
    8.0, 16.0, 14.0, 10.0, 7.0, 6.0, 4.0, 6.0, 7.0, 4.0, 3.0, 2.0, 5.0, 4.0, 2.0,
];

fn rules(area: usize) -> &'static [&'static str] {
    match area {
        0 => &[
            "The Equal Protection Clause requires that classifications based on a suspect characteristic be narrowly tailored to further a compelling governmental interest.",
            "A law that burdens the exercise of a fundamental right is subject to strict scrutiny.",
            "Congress may not commandeer the legislative processes of the States by directly compelling them to enact and enforce a federal regulatory program.",
        ],
        1 => &[
            "A warrantless search of a home is presumptively unreasonable unless it falls within one of the recognized exceptions to the warrant requirement.",
            "The prosecution must disclose evidence favorable to the accused where the evidence is material either to guilt or to punishment.",
            "A defendant's waiver of the right to counsel must be knowing, voluntary, and intelligent.",
        ],
        2 => &[
            "A federal court must dismiss an action whenever it appears that the court lacks jurisdiction of the subject matter.",
            "To survive a motion to dismiss, a complaint must contain sufficient factual matter, accepted as true, to state a claim to relief that is plausible on its face.",
            "Summary judgment is appropriate where there is no genuine dispute as to any material fact and the movant is entitled to judgment as a matter of law.",
        ],
        3 => &[
            "Qualified immunity shields government officials from liability for civil damages insofar as their conduct does not violate clearly established statutory or constitutional rights of which a reasonable person would have known.",
            "A municipality may be held liable under section 1983 only where its policy or custom was the moving force behind the constitutional violation.",
            "The use of excessive force in the course of an arrest is analyzed under the objective reasonableness standard of the Fourth Amendment.",
        ],
        4 => &[
            "A contract is formed when there is an offer, an acceptance, and consideration, together with a mutual manifestation of assent.",
            "Where the language of a contract is clear and unambiguous, its meaning is to be determined from its four corners without resort to extrinsic evidence.",
            "A party who commits a material breach of contract cannot thereafter enforce the contract against the other party.",
        ],
        5 => &[
            "To establish negligence, a plaintiff must prove duty, breach, causation, and damages.",
            "A landowner owes an invitee a duty to exercise reasonable care to protect against dangerous conditions that the landowner knows or should have discovered.",
            "Proximate cause requires that the injury be a reasonably foreseeable consequence of the defendant's conduct.",
        ],
        6 => &[
            "An easement by necessity arises when a parcel of land is conveyed without any means of access except over the grantor's remaining land.",
            "Adverse possession requires possession that is actual, open, notorious, exclusive, hostile, and continuous for the statutory period.",
            "A recorded deed provides constructive notice of its contents to subsequent purchasers.",
        ],
        7 => &[
            "An agency's interpretation of a statute it administers is entitled to no deference when the statute's meaning is clear.",
            "Agency action is arbitrary and capricious if the agency has relied on factors which Congress has not intended it to consider or entirely failed to consider an important aspect of the problem.",
            "A party must exhaust available administrative remedies before seeking judicial review of an agency decision.",
        ],
        8 => &[
            "To establish a prima facie case of discrimination, a plaintiff must show membership in a protected class, qualification for the position, an adverse employment action, and circumstances giving rise to an inference of discrimination.",
            "An employer may be held vicariously liable for a hostile work environment created by a supervisor with immediate authority over the employee.",
            "Retaliation claims require a showing that the protected activity was a but-for cause of the adverse action.",
        ],
        9 => &[
            "To prevail on a claim of copyright infringement, a plaintiff must prove ownership of a valid copyright and copying of constituent elements of the work that are original.",
            "A patent claim is invalid as obvious if the differences between the claimed invention and the prior art would have been obvious to a person having ordinary skill in the art.",
            "Trademark infringement turns on whether the defendant's use of a mark is likely to cause confusion among consumers.",
        ],
        10 => &[
            "Income from whatever source derived is taxable unless it is specifically excluded by statute.",
            "A taxpayer bears the burden of proving entitlement to a claimed deduction.",
            "The substance of a transaction, rather than its form, governs its tax consequences.",
        ],
        11 => &[
            "In custody determinations, the paramount consideration is the best interests of the child.",
            "A court dividing marital property must first classify each asset as marital or separate.",
            "Modification of a support order requires a showing of a substantial change in circumstances.",
        ],
        12 => &[
            "An applicant for asylum must demonstrate a well-founded fear of persecution on account of a protected ground.",
            "Removal proceedings must afford the noncitizen due process, including a meaningful opportunity to be heard.",
            "A conviction qualifies as an aggravated felony only if its elements categorically match the generic federal offense.",
        ],
        13 => &[
            "The automatic stay arises upon the filing of a bankruptcy petition and halts virtually all collection activity against the debtor.",
            "A debt is nondischargeable if it was obtained by false pretenses, a false representation, or actual fraud.",
            "A trustee may avoid a transfer made within ninety days before the petition date if the transfer enabled the creditor to receive more than it would in a liquidation.",
        ],
        _ => &[
            "Section 1 of the Sherman Act prohibits only unreasonable restraints of trade.",
            "A claim of monopolization requires possession of monopoly power in the relevant market and the willful acquisition or maintenance of that power.",
            "Price-fixing agreements among competitors are per se unlawful.",
        ],
    }
}

const RULE_TAIL: &[&str] = &[
    "This standard applies regardless of the nature of the underlying claim.",
    "The burden rests on the party asserting the claim to establish each element.",
    "Courts have consistently applied this principle in a wide variety of contexts.",
    "The inquiry is an objective one, and the subjective intent of the parties is irrelevant.",
    "Any doubts must be resolved in favor of the non-moving party.",
    "A court may not substitute its own judgment for that of the fact finder on questions of credibility.",
    "The same principle governs whether the claim arises under federal or state law.",
    "Failure to satisfy any one of these requirements is fatal to the claim.",
    "Where the facts are undisputed, the question is one of law for the court.",
    "This requirement is not a mere technicality but a fundamental limitation on the power of the courts.",
    "Exceptions to the rule are narrowly construed and must be clearly established by the party invoking them.",
    "The rule reflects a long-standing policy favoring finality and predictability.",
];
const FACT_SPECIFIC: &[&str] = &[
    "In this case, the record shows that the appellant filed the notice of appeal two days after the deadline had expired.",
    "Here, the district court found that the officer had observed the defendant leaving the residence shortly before the search.",
    "The parties in this case stipulated that the contract was signed in March and that payment was never made.",
];

/// Planted truth of one cited passage.
#[derive(Debug, Clone, PartialEq)]
pub struct Passage {
    /// LePaRD-style source passage id (a number as a string).
    pub source_id: String,
    /// Area of law.
    pub area: u8,
    /// States a general legal rule (LEPS1).
    pub general_rule: bool,
    /// Name of the case the passage comes from, e.g. `Smith v. Jones`.
    pub case: String,
}

/// Passage `j`: truth and text.
pub fn passage(j: u64) -> (Passage, String) {
    let mut rng = Rng::row("citation_passages", j);
    let area = rng.weighted(&AREA_WEIGHTS) as u8;
    let general_rule = rng.chance(0.96);
    let case = format!("{} v. {}", rng.pick(LAST_NAMES), rng.pick(LAST_NAMES));
    let source_id = ((j.wrapping_mul(104_729).wrapping_add(7)) % 9_000_000 + 1_000_000).to_string();
    let target = (rng.lognormal(70.0, 0.55, 15.0, 600.0) * 5.3) as usize;
    let mut text = String::new();
    if general_rule {
        push_sentence(&mut text, rng.pick(rules(area as usize)));
    } else {
        push_sentence(&mut text, rng.pick(FACT_SPECIFIC));
    }
    let mut order: Vec<usize> = (0..RULE_TAIL.len()).collect();
    rng.shuffle(&mut order);
    let mut k = 0;
    while text.len() < target && k < order.len() {
        push_sentence(&mut text, RULE_TAIL[order[k]]);
        k += 1;
    }
    (
        Passage {
            source_id,
            area,
            general_rule,
            case,
        },
        text,
    )
}

/// Planted truth of one context.
#[derive(Debug, Clone, PartialEq)]
pub struct Context {
    /// Area of law.
    pub area: u8,
    /// Argues that the cited case's reasoning does not apply (LEP1).
    pub not_apply: bool,
    /// Discusses a procedural or jurisdictional issue (LEP2).
    pub procedural: bool,
    /// Indices of the cited passages, in citation order.
    pub cited: Vec<usize>,
}

const PROCEDURAL: &[&str] = &[
    "Before reaching the merits, we must consider whether the district court had subject-matter jurisdiction over this action.",
    "The threshold question is whether the appeal was timely filed under Rule 4(a).",
    "Defendants argue that venue in this district is improper and that the case should be transferred.",
    "We first address the plaintiffs' standing to bring this challenge.",
    "The government contends that the claim is barred because the plaintiff failed to exhaust administrative remedies.",
    "The motion to remand raises the question whether removal was proper under 28 U.S.C. section 1441.",
];
const MERITS: &[&str] = &[
    "We turn to the merits of the plaintiff's claim.",
    "The central question on appeal is whether the evidence was sufficient to support the jury's verdict.",
    "The parties dispute the proper interpretation of the governing provision.",
    "The district court granted judgment for the defendant, and this appeal followed.",
    "The relevant facts are largely undisputed.",
];
const FILL: &[&str] = &[
    "The record reflects that the parties engaged in extensive discovery over a period of {n} months.",
    "We review the district court's legal conclusions de novo and its factual findings for clear error.",
    "The {party} raised this argument for the first time in its reply brief.",
    "See {case2}, {vol} F.3d {page}, {pin} ({court} {year}).",
    "At oral argument, counsel for the {party} conceded that the issue had not been preserved.",
    "Neither party disputes that the statute applies to the conduct at issue.",
    "The magistrate judge recommended that the motion be granted in part and denied in part.",
    "The {party} filed a timely objection to the report and recommendation.",
    "Our sister circuits have reached differing conclusions on this question.",
    "We have previously declined to adopt a bright-line rule in this area.",
    "The legislative history, although not conclusive, is consistent with this reading.",
    "On remand, the district court will have the opportunity to consider the remaining claims.",
];
const COURTS: &[&str] = &[
    "9th Cir.",
    "2d Cir.",
    "5th Cir.",
    "7th Cir.",
    "D.C. Cir.",
    "3d Cir.",
    "11th Cir.",
    "S.D.N.Y.",
    "N.D. Cal.",
    "1st Cir.",
];
const LEADS: &[&str] = &[
    "As the court explained in {short},",
    "The Supreme Court has made clear that",
    "We have long recognized that",
    "As we stated in {short},",
    "It is well established that",
];
const NOT_APPLY: &[&str] = &[
    "The {party}'s reliance on {case} is misplaced, because the reasoning of that case does not apply to the facts before us.",
    "{case} is readily distinguishable, and its reasoning has no application here.",
    "Unlike the situation in {case}, the statute at issue here contains no such limitation, so that decision does not control.",
];
const APPLY: &[&str] = &[
    "The {party} relies on {case}, which we find instructive.",
    "Our analysis is guided by {case}.",
    "{case} governs this question.",
    "The district court correctly relied on {case}.",
];

/// Context `c` whose first cited passage is `first` (index) with truth `p`.
pub fn context(c: u64, first: usize, p: &Passage) -> (Context, String) {
    let mut rng = Rng::row("citation_contexts", c);
    let area = if rng.chance(0.9) {
        p.area
    } else {
        rng.weighted(&AREA_WEIGHTS) as u8
    };
    let not_apply = rng.chance(0.02);
    let procedural = rng.chance(0.515);
    let target = (rng.lognormal(186.0, 0.45, 20.0, 1500.0) * 4.9) as usize;
    let party = rng.pick(&[
        "plaintiff",
        "defendant",
        "appellant",
        "government",
        "petitioner",
        "respondent",
    ]);
    let short = p.case.split(" v. ").next().unwrap_or("").to_string();
    let cite = format!(
        "{}, {} F.3d {}, {} ({} {})",
        p.case,
        rng.range(100, 999),
        rng.range(1, 1400),
        rng.range(1, 1400),
        rng.pick(COURTS),
        rng.range(1985, 2019)
    );
    let mut text = String::new();
    if procedural {
        push_sentence(&mut text, rng.pick(PROCEDURAL));
    } else {
        push_sentence(&mut text, rng.pick(MERITS));
    }
    push_sentence(
        &mut text,
        &format!(
            "The dispute turns on settled principles of {}.",
            AREAS[area as usize]
        ),
    );
    let lead_case = if not_apply {
        rng.pick(NOT_APPLY)
    } else {
        rng.pick(APPLY)
    };
    let lead_case = expand(&mut rng, lead_case, &[("case", &cite), ("party", party)]);
    let lead = rng.pick(LEADS);
    let closing = expand(&mut rng, lead, &[("short", &short)]);
    let mut order: Vec<usize> = (0..FILL.len()).collect();
    rng.shuffle(&mut order);
    let mut k = 0;
    let mut body = String::new();
    while text.len() + body.len() + lead_case.len() + closing.len() < target && k < order.len() * 3
    {
        let case2 = format!("{} v. {}", rng.pick(LAST_NAMES), rng.pick(LAST_NAMES));
        let vol = rng.range(100, 999).to_string();
        let page = rng.range(1, 1400).to_string();
        let pin = rng.range(1, 1400).to_string();
        let court = rng.pick(COURTS).to_string();
        let year = rng.range(1980, 2019).to_string();
        let n = rng.range(3, 40).to_string();
        let s = expand(
            &mut rng,
            FILL[order[k % order.len()]],
            &[
                ("case2", &case2),
                ("vol", &vol),
                ("page", &page),
                ("pin", &pin),
                ("court", &court),
                ("year", &year),
                ("n", &n),
                ("party", party),
            ],
        );
        k += 1;
        push_sentence(&mut body, &s);
    }
    push_sentence(&mut text, &body);
    push_sentence(&mut text, &lead_case);
    push_sentence(&mut text, &closing);
    (
        Context {
            area,
            not_apply,
            procedural,
            cited: vec![first],
        },
        text,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contexts_cite_their_passage() {
        let (p, pt) = passage(3);
        assert!(!pt.is_empty());
        let (c, t) = context(9, 3, &p);
        assert_eq!(c.cited, vec![3]);
        assert!(t.contains(&p.case) && !t.contains('{'), "{t}");
    }
}
