//! BioDEX stand-in: adverse-event case reports, the reaction terms they list, and
//! the term vocabulary (MedDRA-style preferred terms with their organ class).

use std::sync::OnceLock;

use super::rng::Rng;
use super::text::{LAST_NAMES, expand, push_sentence};

/// BIO_ORGAN_CLASS labels.
pub const ORGAN_CLASSES: [&str; 26] = [
    "cardiac disorders",
    "vascular disorders",
    "nervous system disorders",
    "psychiatric disorders",
    "eye disorders",
    "ear and labyrinth disorders",
    "respiratory, thoracic and mediastinal disorders",
    "gastrointestinal disorders",
    "hepatobiliary disorders",
    "renal and urinary disorders",
    "skin and subcutaneous tissue disorders",
    "musculoskeletal and connective tissue disorders",
    "blood and lymphatic system disorders",
    "immune system disorders",
    "endocrine disorders",
    "metabolism and nutrition disorders",
    "infections and infestations",
    "neoplasms benign, malignant and unspecified",
    "injury, poisoning and procedural complications",
    "investigations",
    "general disorders and administration site conditions",
    "reproductive system and breast disorders",
    "pregnancy, puerperium and perinatal conditions",
    "congenital, familial and genetic disorders",
    "surgical and medical procedures",
    "social circumstances",
];
/// Class index of nervous system disorders.
pub const NERVOUS: u8 = 2;

const BASES: [&[&str]; 26] = [
    &[
        "Atrial fibrillation",
        "Cardiac arrest",
        "Myocardial infarction",
        "Tachycardia",
        "Bradycardia",
        "Cardiac failure",
        "Palpitations",
        "Ventricular tachycardia",
        "Pericarditis",
        "Myocarditis",
        "Cardiomyopathy",
        "Angina pectoris",
    ],
    &[
        "Hypotension",
        "Hypertension",
        "Deep vein thrombosis",
        "Vasculitis",
        "Haemorrhage",
        "Flushing",
        "Shock",
        "Circulatory collapse",
        "Peripheral ischaemia",
        "Thrombophlebitis",
        "Aortic dissection",
        "Haematoma",
    ],
    &[
        "Headache",
        "Dizziness",
        "Seizure",
        "Somnolence",
        "Peripheral neuropathy",
        "Tremor",
        "Syncope",
        "Encephalopathy",
        "Paraesthesia",
        "Ataxia",
        "Cerebral infarction",
        "Dysgeusia",
        "Neurotoxicity",
        "Loss of consciousness",
    ],
    &[
        "Insomnia",
        "Depression",
        "Anxiety",
        "Confusional state",
        "Hallucination",
        "Agitation",
        "Delirium",
        "Suicidal ideation",
        "Psychotic disorder",
        "Mania",
    ],
    &[
        "Vision blurred",
        "Retinal detachment",
        "Cataract",
        "Uveitis",
        "Optic neuritis",
        "Diplopia",
        "Dry eye",
        "Macular oedema",
        "Conjunctivitis",
        "Visual impairment",
    ],
    &[
        "Vertigo",
        "Tinnitus",
        "Deafness",
        "Hypoacusis",
        "Ear pain",
        "Vestibular disorder",
        "Deafness neurosensory",
        "Ear discomfort",
    ],
    &[
        "Dyspnoea",
        "Cough",
        "Pneumonitis",
        "Pulmonary embolism",
        "Respiratory failure",
        "Interstitial lung disease",
        "Pleural effusion",
        "Bronchospasm",
        "Epistaxis",
        "Acute respiratory distress syndrome",
        "Hypoxia",
    ],
    &[
        "Nausea",
        "Vomiting",
        "Diarrhoea",
        "Abdominal pain",
        "Constipation",
        "Pancreatitis",
        "Colitis",
        "Gastrointestinal haemorrhage",
        "Stomatitis",
        "Dysphagia",
        "Intestinal perforation",
        "Dyspepsia",
    ],
    &[
        "Hepatotoxicity",
        "Drug-induced liver injury",
        "Hepatitis",
        "Cholestasis",
        "Hepatic failure",
        "Jaundice",
        "Hyperbilirubinaemia",
        "Hepatic steatosis",
        "Cholecystitis",
    ],
    &[
        "Acute kidney injury",
        "Renal failure",
        "Proteinuria",
        "Haematuria",
        "Nephrotic syndrome",
        "Tubulointerstitial nephritis",
        "Urinary retention",
        "Renal impairment",
        "Nephrolithiasis",
    ],
    &[
        "Rash",
        "Pruritus",
        "Stevens-Johnson syndrome",
        "Toxic epidermal necrolysis",
        "Urticaria",
        "Alopecia",
        "Erythema",
        "Drug reaction with eosinophilia and systemic symptoms",
        "Dermatitis",
        "Rash maculo-papular",
        "Photosensitivity reaction",
        "Angioedema",
    ],
    &[
        "Myalgia",
        "Arthralgia",
        "Rhabdomyolysis",
        "Muscular weakness",
        "Back pain",
        "Osteonecrosis of jaw",
        "Pain in extremity",
        "Muscle spasms",
        "Osteoporosis",
        "Tendonitis",
    ],
    &[
        "Neutropenia",
        "Thrombocytopenia",
        "Anaemia",
        "Febrile neutropenia",
        "Pancytopenia",
        "Agranulocytosis",
        "Leukopenia",
        "Haemolytic anaemia",
        "Eosinophilia",
        "Disseminated intravascular coagulation",
        "Lymphadenopathy",
    ],
    &[
        "Anaphylactic reaction",
        "Hypersensitivity",
        "Cytokine release syndrome",
        "Drug hypersensitivity",
        "Anaphylactic shock",
        "Serum sickness",
        "Immune reconstitution inflammatory syndrome",
        "Graft versus host disease",
    ],
    &[
        "Hypothyroidism",
        "Hyperthyroidism",
        "Adrenal insufficiency",
        "Thyroiditis",
        "Hypophysitis",
        "Cushing's syndrome",
        "Inappropriate antidiuretic hormone secretion",
    ],
    &[
        "Hyponatraemia",
        "Hypokalaemia",
        "Hyperglycaemia",
        "Diabetic ketoacidosis",
        "Lactic acidosis",
        "Decreased appetite",
        "Hypoglycaemia",
        "Dehydration",
        "Hyperkalaemia",
        "Tumour lysis syndrome",
        "Hypomagnesaemia",
    ],
    &[
        "Pneumonia",
        "Sepsis",
        "Urinary tract infection",
        "Herpes zoster",
        "Cytomegalovirus infection",
        "Pneumocystis jirovecii pneumonia",
        "Clostridium difficile colitis",
        "Progressive multifocal leukoencephalopathy",
        "Tuberculosis",
        "Cellulitis",
        "Septic shock",
        "Candida infection",
    ],
    &[
        "Lymphoma",
        "Acute myeloid leukaemia",
        "Squamous cell carcinoma",
        "Basal cell carcinoma",
        "Myelodysplastic syndrome",
        "Malignant melanoma",
        "Neoplasm progression",
        "Breast cancer",
        "Hepatocellular carcinoma",
    ],
    &[
        "Overdose",
        "Fall",
        "Toxicity to various agents",
        "Intentional overdose",
        "Medication error",
        "Infusion related reaction",
        "Off label use",
        "Drug interaction",
        "Product use issue",
        "Wrong technique in product usage process",
        "Fracture",
    ],
    &[
        "Alanine aminotransferase increased",
        "Aspartate aminotransferase increased",
        "Blood creatinine increased",
        "Electrocardiogram QT prolonged",
        "Weight decreased",
        "Platelet count decreased",
        "White blood cell count decreased",
        "Blood pressure increased",
        "International normalised ratio increased",
        "Blood creatine phosphokinase increased",
        "Hepatic enzyme increased",
        "Blood glucose increased",
        "Neutrophil count decreased",
    ],
    &[
        "Pyrexia",
        "Fatigue",
        "Drug ineffective",
        "Death",
        "Asthenia",
        "Oedema peripheral",
        "Chills",
        "Malaise",
        "Injection site reaction",
        "Multiple organ dysfunction syndrome",
        "Chest pain",
        "Condition aggravated",
        "Therapeutic response decreased",
    ],
    &[
        "Gynaecomastia",
        "Amenorrhoea",
        "Erectile dysfunction",
        "Vaginal haemorrhage",
        "Ovarian hyperstimulation syndrome",
        "Priapism",
        "Breast pain",
        "Menorrhagia",
    ],
    &[
        "Foetal exposure during pregnancy",
        "Premature baby",
        "Abortion spontaneous",
        "Pre-eclampsia",
        "Neonatal respiratory distress syndrome",
        "Maternal exposure during pregnancy",
        "Foetal growth restriction",
    ],
    &[
        "Cleft lip and palate",
        "Congenital anomaly",
        "Atrial septal defect",
        "Ventricular septal defect",
        "Neural tube defect",
        "Hypospadias",
    ],
    &[
        "Hospitalisation",
        "Intensive care",
        "Liver transplant",
        "Dialysis",
        "Mechanical ventilation",
        "Drug withdrawal",
        "Colectomy",
        "Haemodialysis",
    ],
    &[
        "Treatment noncompliance",
        "Drug abuse",
        "Homeless",
        "Substance use",
        "Social problem",
        "Impaired driving ability",
    ],
];

/// One-token qualifiers (tier 1), then longer ones (tier 2), then prefixes (tier 3).
const SUFFIXES_1: &[&str] = &[
    " acute",
    " chronic",
    " aggravated",
    " recurrent",
    " severe",
    " transient",
    " bilateral",
    " fatal",
    " mild",
    " exacerbated",
    " primary",
    " secondary",
];
const SUFFIXES_2: &[&str] = &[
    " worsened",
    " localised",
    " generalised",
    " subacute",
    " neonatal",
    " refractory",
    " late onset",
    " early onset",
    " congenital",
];
const PREFIXES: &[&str] = &[
    "Drug-induced ",
    "Post procedural ",
    "Immune-mediated ",
    "Iatrogenic ",
    "Infusion-associated ",
];

/// One vocabulary entry: a reaction term and its organ class.
#[derive(Debug, Clone)]
pub struct Term {
    /// Term text, e.g. `Acute kidney injury`.
    pub name: String,
    /// Organ class (index into [`ORGAN_CLASSES`]).
    pub class: u8,
}

/// The deterministic term vocabulary, most common terms first: every base term
/// (shuffled), then the modified forms (shuffled). Term `k` never changes.
pub fn vocabulary() -> &'static [Term] {
    static V: OnceLock<Vec<Term>> = OnceLock::new();
    V.get_or_init(|| {
        let mut rng = Rng::row("terms.vocabulary", 0);
        let mut tiers: [Vec<Term>; 4] = Default::default();
        for (c, list) in BASES.iter().enumerate() {
            for b in list.iter() {
                let class = c as u8;
                tiers[0].push(Term {
                    name: b.to_string(),
                    class,
                });
                for s in SUFFIXES_1 {
                    tiers[1].push(Term {
                        name: format!("{b}{s}"),
                        class,
                    });
                }
                for s in SUFFIXES_2 {
                    tiers[2].push(Term {
                        name: format!("{b}{s}"),
                        class,
                    });
                }
                for p in PREFIXES {
                    let lower = b[..1].to_lowercase() + &b[1..];
                    tiers[3].push(Term {
                        name: format!("{p}{lower}"),
                        class,
                    });
                }
            }
        }
        let mut out = Vec::new();
        for mut t in tiers {
            rng.shuffle(&mut t);
            out.extend(t);
        }
        out
    })
}

/// Term `k` of the vocabulary, extended with numbered variants past its end.
pub fn term(k: usize) -> Term {
    let v = vocabulary();
    if k < v.len() {
        v[k].clone()
    } else {
        let b = &v[k % v.len()];
        Term {
            name: format!("{} type {}", b.name, k / v.len() + 1),
            class: b.class,
        }
    }
}

/// Planted truth of one report.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// Listed reactions (vocabulary indices, listing order).
    pub reactions: Vec<usize>,
    /// Every term the patient experienced (listed reactions included), sorted.
    pub experienced: Vec<usize>,
    /// Terms mentioned as absent, sorted.
    pub negated: Vec<usize>,
    /// Describes a serious or life-threatening event.
    pub serious: bool,
}

/// Structure of report `i`: `known` terms were introduced by earlier reports, terms
/// `known..introduced` are new with this one.
pub fn report_struct(i: u64, known: usize, introduced: usize) -> Report {
    let mut rng = Rng::row("reports.struct", i);
    let mut reactions: Vec<usize> = (known..introduced).collect();
    let extra = if known == 0 { 0 } else { rng.range(0, 5) };
    for _ in 0..extra {
        let k = rng.zipf(known);
        if !reactions.contains(&k) {
            reactions.push(k);
        }
    }
    if reactions.is_empty() {
        reactions.push(rng.zipf(known.max(1)));
    }
    rng.shuffle(&mut reactions);
    let mut experienced: Vec<usize> = reactions.clone();
    let n_extra = rng
        .range(18, 42)
        .min(introduced.saturating_sub(reactions.len()));
    let mut tries = 0;
    while experienced.len() < reactions.len() + n_extra && tries < n_extra * 20 {
        tries += 1;
        let k = if rng.chance(0.7) {
            rng.zipf(introduced)
        } else {
            rng.below(introduced)
        };
        if !experienced.contains(&k) {
            experienced.push(k);
        }
    }
    experienced.sort_unstable();
    let mut negated = Vec::new();
    for _ in 0..rng.range(2, 7) {
        let k = rng.below(introduced);
        if experienced.binary_search(&k).is_err() && !negated.contains(&k) {
            negated.push(k);
        }
    }
    negated.sort_unstable();
    let serious = rng.chance(0.6);
    Report {
        reactions,
        experienced,
        negated,
        serious,
    }
}

const CHARS_PER_TOKEN: f64 = 5.0;

const DRUGS: &[(&str, &str, &str)] = &[
    (
        "nivolumab",
        "immune checkpoint inhibitor",
        "metastatic melanoma",
    ),
    (
        "pembrolizumab",
        "immune checkpoint inhibitor",
        "non-small cell lung cancer",
    ),
    ("methotrexate", "antimetabolite", "rheumatoid arthritis"),
    (
        "amiodarone",
        "class III antiarrhythmic",
        "atrial fibrillation",
    ),
    (
        "vancomycin",
        "glycopeptide antibiotic",
        "methicillin-resistant Staphylococcus aureus bacteremia",
    ),
    ("carbamazepine", "anticonvulsant", "epilepsy"),
    (
        "clozapine",
        "atypical antipsychotic",
        "treatment-resistant schizophrenia",
    ),
    ("lithium", "mood stabilizer", "bipolar disorder"),
    ("warfarin", "vitamin K antagonist", "deep vein thrombosis"),
    (
        "rivaroxaban",
        "direct factor Xa inhibitor",
        "atrial fibrillation",
    ),
    ("cisplatin", "platinum compound", "head and neck cancer"),
    ("capecitabine", "fluoropyrimidine", "colorectal cancer"),
    ("infliximab", "TNF-alpha inhibitor", "Crohn's disease"),
    ("adalimumab", "TNF-alpha inhibitor", "ulcerative colitis"),
    ("atorvastatin", "statin", "hypercholesterolemia"),
    ("levetiracetam", "anticonvulsant", "focal epilepsy"),
    ("allopurinol", "xanthine oxidase inhibitor", "gout"),
    (
        "isoniazid",
        "antituberculosis agent",
        "pulmonary tuberculosis",
    ),
    ("valproic acid", "anticonvulsant", "generalized epilepsy"),
    (
        "tacrolimus",
        "calcineurin inhibitor",
        "kidney transplantation",
    ),
    ("cyclophosphamide", "alkylating agent", "lupus nephritis"),
    (
        "rituximab",
        "anti-CD20 monoclonal antibody",
        "diffuse large B-cell lymphoma",
    ),
    (
        "sertraline",
        "selective serotonin reuptake inhibitor",
        "major depressive disorder",
    ),
    ("metformin", "biguanide", "type 2 diabetes mellitus"),
    (
        "ciprofloxacin",
        "fluoroquinolone",
        "complicated urinary tract infection",
    ),
    ("linezolid", "oxazolidinone antibiotic", "osteomyelitis"),
    (
        "ibuprofen",
        "nonsteroidal anti-inflammatory drug",
        "osteoarthritis",
    ),
    (
        "imatinib",
        "tyrosine kinase inhibitor",
        "chronic myeloid leukemia",
    ),
    (
        "bevacizumab",
        "anti-VEGF monoclonal antibody",
        "ovarian cancer",
    ),
    (
        "dapagliflozin",
        "SGLT2 inhibitor",
        "heart failure with reduced ejection fraction",
    ),
    ("olanzapine", "atypical antipsychotic", "schizophrenia"),
];

fn article(word: &str) -> &'static str {
    if word.starts_with(['a', 'e', 'i', 'o', 'u', 'A', 'E', 'I', 'O', 'U']) {
        "an"
    } else {
        "a"
    }
}

const INTRO: &[&str] = &[
    "{Drug} is {a_class} {class} that is widely used in the treatment of {condition}.",
    "Since its approval, {drug} has become a cornerstone of therapy for {condition} in many centers.",
    "The mechanism of action of {drug} involves modulation of pathways that are also expressed in several organ systems, which may explain some of its off-target effects.",
    "Adverse events associated with {class}s range from mild and self-limiting to severe and occasionally fatal [{n}].",
    "Large post-marketing surveillance studies have reported an overall incidence of serious adverse events of {pct}% among patients receiving {drug} [{n}].",
    "The pharmacokinetics of {drug} are influenced by renal function, hepatic metabolism and concomitant medications, particularly inhibitors of cytochrome P450 3A4.",
    "Several case series have described unexpected toxicities in patients treated with {drug}, although the causal relationship often remains uncertain [{n}].",
    "Risk factors for toxicity include advanced age, pre-existing organ dysfunction, polypharmacy and genetic polymorphisms affecting drug metabolism.",
    "Current guidelines recommend regular clinical and laboratory monitoring during the first months of treatment with {drug} [{n}].",
    "In clinical trials, the most frequently reported adverse reactions were generally mild, and discontinuation because of toxicity occurred in {pct}% of participants.",
    "Despite extensive experience with {class}s, rare idiosyncratic reactions continue to be reported and may be underrecognized in routine practice.",
    "Here we report a case that illustrates the diagnostic challenges associated with this class of agents.",
];
const DISCUSSION: &[&str] = &[
    "The temporal relationship between the initiation of {drug} and the onset of symptoms strongly suggests a causal association.",
    "Using the Naranjo adverse drug reaction probability scale, the reaction was classified as probable, with a score of {score}.",
    "Alternative causes, including viral infection, autoimmune disease and other concomitant medications, were considered and excluded by appropriate investigations.",
    "To our knowledge, only {small} similar cases have been described in the literature to date [{n}].",
    "The underlying mechanism remains incompletely understood, but an immune-mediated process has been proposed by several authors [{n}].",
    "{Name} et al. described a comparable presentation in a patient receiving {drug} for {condition}, with complete recovery after withdrawal of the drug [{n}].",
    "Clinicians should be aware that this reaction may occur even after several months of uneventful therapy.",
    "Early recognition and prompt discontinuation of the suspected agent are essential to prevent progression and irreversible organ damage.",
    "Rechallenge was not attempted because of the severity of the initial presentation and the availability of therapeutic alternatives.",
    "Dose-dependent toxicity is unlikely in this case, as serum concentrations remained within the therapeutic range throughout the course of treatment.",
    "Genetic testing for HLA alleles associated with drug hypersensitivity was not performed, which represents a limitation of this report.",
    "This case highlights the importance of pharmacovigilance and the reporting of suspected adverse drug reactions to regulatory authorities.",
    "A multidisciplinary approach involving {specialty}, pharmacy and nursing staff was essential for the management of this patient.",
    "The patient's comorbidities may have contributed to the severity of the reaction, although they were stable before the introduction of {drug}.",
    "Retrospective cohort studies suggest that the risk is highest in the first {small} weeks of therapy [{n}].",
];
const SPECIALTIES: &[&str] = &[
    "cardiology",
    "nephrology",
    "hepatology",
    "neurology",
    "dermatology",
    "hematology",
    "oncology",
    "intensive care",
    "infectious diseases",
    "endocrinology",
];
const EXPERIENCED: &[&str] = &[
    "On day {day} of treatment, the patient developed {t}.",
    "Clinical examination revealed {t}.",
    "The patient subsequently experienced {t}, which was attributed to {drug}.",
    "{T} was documented on day {day} of hospitalization.",
    "She also reported {t} during the following week.",
    "Further evaluation confirmed {t}.",
    "The course was complicated by {t}.",
];
const NEGATED: &[&str] = &[
    "There was no evidence of {t}.",
    "{T} was ruled out by appropriate investigations.",
    "The patient denied any history of {t}.",
];

/// Generates the text of report `i` with its planted truth `r`.
pub fn report_text(i: u64, r: &Report) -> String {
    let mut rng = Rng::row("reports.text", i);
    let target_tokens = rng.lognormal(3600.0, 0.5, 250.0, 16000.0);
    let target_chars = (target_tokens * CHARS_PER_TOKEN) as usize;
    let (drug, class, condition) = *rng.pick_ref(DRUGS);
    let a_class = article(class);
    let female = rng.chance(0.55);
    let age = rng.range(19, 88);
    let sex = if female { "woman" } else { "man" };
    let pron = if female { "She" } else { "He" };
    let main = term(r.reactions[0]).name.to_lowercase();
    let drug_cap = super::text::capitalize(drug);
    let specialty = rng.pick(SPECIALTIES);
    let vars = |rng: &mut Rng| -> Vec<(&'static str, String)> {
        vec![
            ("drug", drug.to_string()),
            ("Drug", drug_cap.clone()),
            ("class", class.to_string()),
            ("a_class", a_class.to_string()),
            ("condition", condition.to_string()),
            ("specialty", specialty.to_string()),
            ("n", rng.range(1, 40).to_string()),
            ("pct", rng.range(2, 35).to_string()),
            ("score", rng.range(5, 8).to_string()),
            ("small", rng.range(3, 15).to_string()),
            ("day", rng.range(2, 60).to_string()),
            ("Name", rng.pick(LAST_NAMES).to_string()),
        ]
    };
    let exp = |rng: &mut Rng, t: &str, extra: &[(&'static str, String)]| -> String {
        let mut v = vars(rng);
        v.extend(extra.iter().cloned());
        let refs: Vec<(&str, &str)> = v.iter().map(|(k, s)| (*k, s.as_str())).collect();
        let s = expand(rng, t, &refs);
        s.replace("She ", &format!("{pron} "))
    };
    let mut out = String::with_capacity(target_chars + 2000);
    out.push_str(&format!("{drug_cap}-associated {main} in a {age}-year-old {sex} treated for {condition}: a case report\n\n"));
    out.push_str("Abstract\n");
    let mut abs = String::new();
    push_sentence(
        &mut abs,
        &format!(
            "Background: {drug_cap} is {a_class} {class} used in the treatment of {condition}."
        ),
    );
    push_sentence(
        &mut abs,
        &format!(
            "Case presentation: We describe a {age}-year-old {sex} who developed {main} after starting {drug}."
        ),
    );
    let listed: Vec<String> = r
        .reactions
        .iter()
        .map(|&k| term(k).name.to_lowercase())
        .collect();
    push_sentence(
        &mut abs,
        &format!("Adverse reactions included {}.", listed.join(", ")),
    );
    if r.serious {
        push_sentence(
            &mut abs,
            "The event was life-threatening and required admission to the intensive care unit.",
        );
    } else {
        push_sentence(
            &mut abs,
            "The event was mild and resolved after discontinuation of the drug without hospitalization.",
        );
    }
    push_sentence(
        &mut abs,
        "Conclusions: Clinicians should be aware of this potential adverse reaction.",
    );
    out.push_str(&abs);
    // Fixed sections with planted facts.
    let mut case = String::new();
    push_sentence(
        &mut case,
        &format!(
            "A {age}-year-old {sex} with a history of {condition} was started on {drug} at a dose of {} mg daily.",
            rng.range(1, 60) * 10
        ),
    );
    for &k in &r.experienced {
        let t = term(k).name;
        let tmpl = rng.pick(EXPERIENCED);
        let s = exp(&mut rng, tmpl, &[("t", t.to_lowercase()), ("T", t.clone())]);
        push_sentence(&mut case, &s);
    }
    for &k in &r.negated {
        let t = term(k).name;
        let tmpl = rng.pick(NEGATED);
        let s = exp(&mut rng, tmpl, &[("t", t.to_lowercase()), ("T", t.clone())]);
        push_sentence(&mut case, &s);
    }
    if r.serious {
        let s = rng.pick(&[
            "Because of rapid clinical deterioration, the patient was transferred to the intensive care unit, where mechanical ventilation and vasopressor support were required.",
            "The reaction was considered life-threatening; the patient required emergency hospitalization and remained in critical condition for several days.",
            "Despite intensive supportive care, the patient's condition deteriorated, and the event was classified as serious and life-threatening.",
        ]);
        push_sentence(&mut case, s);
    } else {
        let s = rng.pick(&[
            "The symptoms were mild, and the patient was managed as an outpatient.",
            "After withdrawal of the drug, all symptoms resolved within a few days without the need for hospitalization.",
            "The reaction was considered non-serious and resolved completely with symptomatic treatment.",
        ]);
        push_sentence(&mut case, s);
    }
    let labs = format!(
        "Laboratory tests showed a hemoglobin of {}.{} g/dL, a white blood cell count of {}.{} x 10^9/L, a platelet count of {} x 10^9/L, serum creatinine of {}.{} mg/dL and alanine aminotransferase of {} U/L.",
        rng.range(7, 15),
        rng.below(10),
        rng.range(2, 18),
        rng.below(10),
        rng.range(40, 400),
        rng.range(0, 4),
        rng.below(10),
        rng.range(10, 900)
    );
    push_sentence(&mut case, &labs);
    // Fill introduction and discussion to the target length.
    let fixed = out.len() + case.len() + 200;
    let remaining = target_chars.saturating_sub(fixed);
    let mut intro = String::new();
    let mut disc = String::new();
    let intro_share = remaining * 2 / 5;
    let mut order: Vec<usize> = (0..INTRO.len()).collect();
    rng.shuffle(&mut order);
    let mut j = 0;
    while intro.len() < intro_share {
        let t = INTRO[order[j % order.len()]];
        j += 1;
        let s = exp(&mut rng, t, &[]);
        push_sentence(&mut intro, &s);
        if j % 5 == 0 {
            intro.push_str("\n\n");
        }
    }
    let mut order: Vec<usize> = (0..DISCUSSION.len()).collect();
    rng.shuffle(&mut order);
    j = 0;
    while disc.len() < remaining - intro_share.min(remaining) {
        let t = DISCUSSION[order[j % order.len()]];
        j += 1;
        let s = exp(&mut rng, t, &[]);
        push_sentence(&mut disc, &s);
        if j % 6 == 0 {
            disc.push_str("\n\n");
        }
    }
    out.push_str("\n\nIntroduction\n");
    out.push_str(intro.trim_end());
    out.push_str("\n\nCase presentation\n");
    out.push_str(&case);
    out.push_str("\n\nDiscussion\n");
    out.push_str(disc.trim_end());
    out.push_str("\n\nConclusion\n");
    out.push_str(&format!(
        "This case describes {main} associated with {drug}. Physicians prescribing {drug} should monitor patients closely and report suspected adverse reactions."
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vocabulary_is_distinct_and_large() {
        let v = vocabulary();
        assert!(v.len() > 5000, "{}", v.len());
        let set: std::collections::HashSet<&str> = v.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(set.len(), v.len());
        assert_ne!(term(v.len()).name, term(0).name);
    }

    #[test]
    fn reports_mention_what_they_plant() {
        let r = report_struct(10, 20, 23);
        assert!(r.reactions.contains(&20) && r.reactions.contains(&22));
        assert!(r.reactions.iter().all(|k| r.experienced.contains(k)));
        assert!(r.negated.iter().all(|k| !r.experienced.contains(k)));
        let t = report_text(10, &r);
        assert!(!t.contains('{'), "{t}");
        for &k in &r.experienced {
            assert!(t.to_lowercase().contains(&term(k).name.to_lowercase()));
        }
    }
}
