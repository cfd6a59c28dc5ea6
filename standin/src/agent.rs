//! SWE-Next stand-in: coding-agent trajectories (CodeAct XML tool calls, tool
//! replies, test runs) and their snapshots after every 5th assistant turn.

use super::rng::Rng;
use super::text::push_sentence;

/// AGENT_PROGRESS labels.
pub const PROGRESS: [&str; 5] = [
    "has not located the relevant code",
    "located the relevant code",
    "changed the code, not checked",
    "changed the code, check passes",
    "changed the code, check fails",
];
/// AGENT_TEST_RESULT labels.
pub const TEST_RESULTS: [&str; 4] = [
    "bug fixed, tests pass",
    "bug still occurs",
    "bug fixed, other tests fail",
    "run errored",
];
/// AGENT_DOMAIN labels.
pub const DOMAINS: [&str; 27] = [
    "Communications",
    "Database",
    "Documentation",
    "File Formats",
    "Internet :: WWW/HTTP",
    "Multimedia :: Graphics",
    "Multimedia :: Sound/Audio",
    "Multimedia :: Video",
    "Office/Business :: Financial",
    "Scientific/Engineering :: Artificial Intelligence",
    "Scientific/Engineering :: Artificial Life",
    "Scientific/Engineering :: Bio-Informatics",
    "Scientific/Engineering :: GIS",
    "Scientific/Engineering :: Mathematics",
    "Scientific/Engineering :: Medical Science Apps.",
    "Security",
    "Software Development :: Build Tools",
    "Software Development :: Compilers",
    "Software Development :: Embedded Systems",
    "Software Development :: Quality Assurance",
    "Software Development :: Testing",
    "Software Development :: User Interfaces",
    "System :: Distributed Computing",
    "System :: Networking",
    "Text Processing :: Linguistic",
    "Text Processing :: Markup",
    "Utilities",
];
const DOMAIN_WEIGHTS: [f64; 27] = [
    2.0, 6.0, 2.0, 4.0, 10.0, 3.0, 1.5, 1.0, 2.0, 6.0, 0.5, 2.0, 2.0, 6.0, 1.0, 3.0, 4.0, 2.0, 1.0,
    3.0, 5.0, 3.0, 3.0, 3.0, 2.0, 4.0, 8.0,
];
/// AGENT_ROOT_CAUSE labels.
pub const ROOT_CAUSES: [&str; 8] = [
    "assignment",
    "checking",
    "algorithm",
    "function",
    "interface",
    "timing or serialization",
    "build, package, or merge",
    "documentation",
];
const ROOT_WEIGHTS: [f64; 8] = [14.0, 26.0, 20.0, 14.0, 12.0, 5.0, 5.0, 4.0];

fn domain_words(d: usize) -> (&'static [&'static str], &'static [&'static str]) {
    match d {
        0 => (
            &["mailkit", "smtpflow", "chatbridge"],
            &["message", "mailbox", "channel", "envelope"],
        ),
        1 => (
            &["sqlmodelx", "pgkit", "tinyorm", "dbshift"],
            &["query", "cursor", "table", "migration"],
        ),
        2 => (
            &["docbuilder", "apidocs", "sphinxlite"],
            &["docstring", "section", "toctree", "directive"],
        ),
        3 => (
            &["tomlkit2", "csvtools", "parquetlite", "yamlfix"],
            &["parser", "record", "schema", "encoder"],
        ),
        4 => (
            &["httpserve", "webtoolkit", "restfast", "urlkit"],
            &["request", "response", "router", "header"],
        ),
        5 => (
            &["pixelkit", "svgdraw", "imagetools"],
            &["canvas", "image", "palette", "shape"],
        ),
        6 => (
            &["audiokit", "wavetools", "soundfx"],
            &["sample", "waveform", "stream", "codec"],
        ),
        7 => (
            &["videoframe", "clipkit", "movieeditor"],
            &["frame", "clip", "timeline", "codec"],
        ),
        8 => (
            &["ledgerpy", "moneyfmt", "invoicer"],
            &["account", "amount", "currency", "ledger"],
        ),
        9 => (
            &["neuralkit", "tinyml", "autotune"],
            &["model", "layer", "tensor", "optimizer"],
        ),
        10 => (
            &["lifegrid", "evosim"],
            &["cell", "genome", "population", "grid"],
        ),
        11 => (
            &["seqtools", "biofold", "genomekit"],
            &["sequence", "alignment", "gene", "codon"],
        ),
        12 => (
            &["geoshape", "mapkit", "rasterio2"],
            &["geometry", "polygon", "projection", "tile"],
        ),
        13 => (
            &["sympylite", "numkit", "linalgx"],
            &["matrix", "polynomial", "integral", "vector"],
        ),
        14 => (
            &["dicomkit", "medrecords"],
            &["scan", "patient", "series", "dose"],
        ),
        15 => (
            &["cryptokit", "authguard", "tokenlib"],
            &["token", "cipher", "signature", "key"],
        ),
        16 => (
            &["buildfast", "pkgmaker", "wheelkit"],
            &["target", "package", "dependency", "artifact"],
        ),
        17 => (
            &["pyparsec", "astkit", "bytecodex"],
            &["token", "node", "grammar", "lexer"],
        ),
        18 => (
            &["microflash", "serialbus"],
            &["register", "device", "firmware", "port"],
        ),
        19 => (
            &["lintkit", "codecheck", "qualitybot"],
            &["rule", "checker", "violation", "report"],
        ),
        20 => (
            &["pytest-extra", "mockery", "fixturekit"],
            &["fixture", "assertion", "marker", "runner"],
        ),
        21 => (
            &["tuikit", "widgetly", "formgen"],
            &["widget", "layout", "event", "window"],
        ),
        22 => (
            &["taskqueue", "clusterkit", "rpcflow"],
            &["worker", "task", "scheduler", "node"],
        ),
        23 => (
            &["netscan", "socketkit", "dnsutil"],
            &["socket", "packet", "address", "connection"],
        ),
        24 => (
            &["tokenizerx", "lemmakit", "nlptools"],
            &["token", "sentence", "lemma", "corpus"],
        ),
        25 => (
            &["markdownx", "htmlclean", "rstkit"],
            &["element", "node", "attribute", "renderer"],
        ),
        _ => (
            &["clitools", "pathkit", "datetimeutil", "configkit"],
            &["option", "path", "config", "value"],
        ),
    }
}

/// The rendered system prompt shared by every trajectory (≈ 1.5 k tokens).
const SYSTEM_PROMPT: &str = "You are a programming agent who is provided a github issue and repository bash environment and is tasked to solve certain tasks (e.g., file localization, testcase generation, code repair and editing etc) to resolve the issue.

We have access to the following functions:

---- BEGIN FUNCTION #1: file_editor ----
Description:
Custom editing tool for viewing, creating and editing files
  - State is persistent across command calls and discussions with the user
  - If `path` is a file, `view` displays the result of applying `cat -n`. If `path` is a directory, `view` lists non-hidden files and directories up to 2 levels deep
  - The `create` command cannot be used if the specified `path` already exists as a file
  - If a `command` generates a long output, it will be truncated and marked with `<response clipped>`
  - The `undo_edit` command will revert the last edit made to the file at `path`

Notes for using the `str_replace` command:
  - The `old_str` parameter should match EXACTLY one or more consecutive lines from the original file. Be mindful of whitespaces!
  - If the `old_str` parameter is not unique in the file, the replacement will not be performed. Make sure to include enough context in `old_str` to make it unique
  - The `new_str` parameter should contain the edited lines that should replace the `old_str`

Parameters:
  1. command (string, required)
Allowed values: [`view`, `create`, `str_replace`, `insert`, `undo_edit`]
The commands to run.
  2. path (string, required)
Absolute path to file or directory, e.g. `/testbed/file.py` or `/testbed`.
  3. file_text (string, optional)
Required parameter of `create` command, with the content of the file to be created.
  4. old_str (string, optional)
Required parameter of `str_replace` command containing the string in `path` to replace.
  5. new_str (string, optional)
Optional parameter of `str_replace` command containing the new string (if not given, no string will be added). Required parameter of `insert` command containing the string to insert.
  6. insert_line (integer, optional)
Required parameter of `insert` command. The `new_str` will be inserted AFTER the line `insert_line` of `path`.
  7. view_range (array, optional)
Optional parameter of `view` command when `path` points to a file. If none is given, the full file is shown. If provided, the file will be shown in the indicated line number range, e.g. [11, 12] will show lines 11 and 12. Indexing at 1 to start. Setting `[start_line, -1]` shows all lines from `start_line` to the end of the file.
---- END FUNCTION #1 ----

---- BEGIN FUNCTION #2: execute_bash ----
Description:
Execute a bash command in the terminal.

Behavior notes:
  - If a command may run indefinitely (long-running), consider running it in the background and redirecting output, e.g. python3 app.py > server.log 2>&1 &.
  - If the bash command returns exit code -1, it means the process is still running. The assistant may:
    - Send empty command to retrieve additional logs
    - Send text (set command to the text) to STDIN of the running process
    - Send control commands (like C-c, C-d, C-z) to interrupt the process
  - If the command times out, it will be interrupted (SIGINT). The assistant may then retry or do further steps if needed.

Parameters:
  1. cmd (string, required)
The bash command (and optional arguments) to execute.
  - Can be empty (\"\") to retrieve more logs if the process is still running.
  - Can be a special key name to control the running process, e.g. \"C-c\" (interrupt) or \"C-z\" (suspend).
  2. timeout (integer, optional)
Optional timeout in seconds for the command. Defaults to 300.
---- END FUNCTION #2 ----

---- BEGIN FUNCTION #3: search ----
Description:
Search for a term in a directory or a single file.
  - If `path` is a directory (or unspecified, default is `.`), it recursively searches all non-hidden files and directories for the search term.
  - If `path` is a file, it runs a `grep -n` in that file to show line numbers matching the search term.
  - If more than 100 files match in a directory search, an error is returned and the user is asked to narrow the search.
  - If no matches are found, it will inform the user accordingly.

Parameters:
  1. search_term (string, required)
The term or string to search for in files.
  2. path (string, optional)
The file or directory to search in. Defaults to . if not specified.
---- END FUNCTION #3 ----

---- BEGIN FUNCTION #4: finish ----
Description:
Finish the interaction once the task is complete or if no further progress can be made.

Behavior notes:
  - The `submit` command finalizes your output.

Parameters:
  1. command (string, required)
Currently allowed value: [`submit`]
  2. result (string, optional)
The result text or final message to submit. Defaults to an empty string if not provided.
---- END FUNCTION #4 ----

If you choose to call a function ONLY reply in the following format with NO suffix:

<function=example_function_name>
<parameter=example_parameter_1>value_1</parameter>
<parameter=example_parameter_2>
This is the value for the second parameter
that can span
multiple lines
</parameter>
</function>

<IMPORTANT>
Reminder:
- Function calls MUST follow the specified format, start with <function= and end with </function>
- Required parameters MUST be specified
- Only call one function at a time
- VERY IMPORTANT: Each response must include both reasoning (as natural text) and function call (in above format) to solve the task.
- Your task is to make the minimal changes to non-test files in the /testbed directory to ensure the issue is resolved.
- First explore the repository to familiarize yourself with its structure, then create a script to reproduce the error and execute it to confirm the error, then edit the sourcecode of the repo to resolve the issue, then rerun your reproduce script and confirm that the error is fixed, and finally think about edgecases and make sure your fix handles them as well.
</IMPORTANT>";

/// Planted truth of one snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// Trajectory index.
    pub trajectory: u32,
    /// Assistant turns covered (5, 10, …).
    pub turn: u32,
    /// Qwen3 tokens of the snapshot text.
    pub tokens: u32,
    /// Recovered after an unsuccessful approach.
    pub recovered: bool,
    /// A plausible fix is in place.
    pub implemented_fix: bool,
    /// AGENT_PROGRESS index.
    pub progress: u8,
    /// AGENT_TEST_RESULT index.
    pub test_result: u8,
    /// AGENT_DOMAIN index.
    pub domain: u8,
    /// AGENT_ROOT_CAUSE index.
    pub root_cause: u8,
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Act {
    ViewDir,
    Search,
    ViewOther,
    ViewTarget,
    CreateRepro,
    RunRepro,
    WrongEdit,
    Undo,
    FixEdit,
    RunTests,
    Finish,
}

#[derive(Default, Clone, Copy)]
struct State {
    located: bool,
    edit_active: bool,
    fix: bool,
    run_after_edit: Option<bool>,
    last_run: Option<u8>,
    failed_approach: bool,
    recovered: bool,
}

/// A generated trajectory: rendered messages and the state after each assistant turn.
pub struct Trajectory {
    /// Messages, rendered `"[ROLE]\n" + content`.
    pub messages: Vec<String>,
    /// Message count (prefix length) after assistant turn `k+1` and its tool reply.
    pub turn_end: Vec<usize>,
    states: Vec<State>,
    domain: u8,
    root_cause: u8,
}

struct Ctx {
    project: &'static str,
    module: String,
    file: String,
    func: String,
    noun: &'static str,
    other_files: Vec<String>,
    root_cause: usize,
}

fn ident(rng: &mut Rng, noun: &str) -> String {
    let verbs = [
        "parse",
        "load",
        "build",
        "get",
        "resolve",
        "format",
        "validate",
        "apply",
        "merge",
        "encode",
        "read",
        "update",
        "normalize",
    ];
    format!("{}_{}", rng.pick(&verbs), noun)
}

fn py_function(rng: &mut Rng, ctx: &Ctx, name: &str) -> Vec<String> {
    let method = rng.chance(0.4);
    let base = if method { "    " } else { "" };
    let arg = rng.pick(&["value", "data", "options", "path", "items", "config", "obj"]);
    let mut out = vec![String::new()];
    if method {
        out.push(format!("    def {name}(self, {arg}, strict=False):"));
    } else {
        out.push(format!("def {name}({arg}, default=None):"));
    }
    out.push(format!(
        "{base}    \"\"\"Return the {} for the given {arg}.\"\"\"",
        ctx.noun
    ));
    let body = rng.range(3, 12);
    let mut depth = 1;
    for _ in 0..body {
        let ind = format!("{base}{}", "    ".repeat(depth));
        let var = rng.pick(&[
            "result", "value", "items", "key", "node", "buf", "state", "entry",
        ]);
        let line = match rng.below(9) {
            0 if depth < 3 => {
                depth += 1;
                format!("{ind}if {var} is None:")
            }
            1 if depth < 3 => {
                depth += 1;
                format!(
                    "{ind}for {var} in {}:",
                    rng.pick(&["items", "self._cache", "data.values()", "sorted(keys)"])
                )
            }
            2 => format!("{ind}{var} = self._{}({var})", ident(rng, ctx.noun)),
            3 => format!(
                "{ind}raise {}(f\"invalid {}: {{{var}!r}}\")",
                rng.pick(&["ValueError", "TypeError", "KeyError"]),
                ctx.noun
            ),
            4 => format!(
                "{ind}{var}.append({})",
                rng.pick(&["entry", "node", "value.strip()", "item"])
            ),
            5 => format!(
                "{ind}log.debug(\"%s %s\", {var}, {})",
                rng.pick(&["key", "self.name", "len(items)"])
            ),
            6 => format!(
                "{ind}{var} = {}.get({}, {})",
                rng.pick(&["kwargs", "self.options", "mapping"]),
                rng.pick(&["'name'", "key", "'mode'"]),
                rng.pick(&["None", "0", "''"])
            ),
            _ => format!(
                "{ind}{var} = {}",
                rng.pick(&["[]", "{}", "None", "0", "dict(mapping)", "list(items)"])
            ),
        };
        out.push(line);
        if depth > 1 && rng.chance(0.35) {
            depth -= 1;
        }
    }
    out.push(format!(
        "{base}    return {}",
        rng.pick(&["result", "value", "default", "items", "state"])
    ));
    out
}

fn code_lines(rng: &mut Rng, ctx: &Ctx, start: usize, n: usize, target: bool) -> String {
    let mut out = String::with_capacity(n * 40);
    let mut line = start;
    let mut first = true;
    while line < start + n {
        let name = if target && line > start + n / 3 && first {
            ctx.func.clone()
        } else {
            ident(rng, ctx.noun)
        };
        if name == ctx.func {
            first = false;
        }
        for l in py_function(rng, ctx, &name) {
            if line >= start + n {
                break;
            }
            out.push_str(&format!("{line:6}\t{l}\n"));
            line += 1;
        }
    }
    out
}

fn call(func: &str, params: &[(&str, &str)]) -> String {
    let mut s = format!("<function={func}>\n");
    for (k, v) in params {
        if v.contains('\n') {
            s.push_str(&format!("<parameter={k}>\n{v}\n</parameter>\n"));
        } else {
            s.push_str(&format!("<parameter={k}>{v}</parameter>\n"));
        }
    }
    s.push_str("</function>");
    s
}

const BUGS: [(&str, &str, &str); 8] = [
    (
        "        {v} = None",
        "        {v} = self._defaults.copy()",
        "is initialized to None instead of a copy of the defaults",
    ),
    (
        "        if {v}:",
        "        if {v} is not None and len({v}) > 0:",
        "does not check for an empty input before indexing",
    ),
    (
        "        return sorted({v})[0]",
        "        return max({v}, key=lambda x: x.priority)",
        "picks the wrong element because the result is computed with the wrong ordering",
    ),
    (
        "        raise NotImplementedError",
        "        return self._convert({v})",
        "raises NotImplementedError because the conversion was never implemented",
    ),
    (
        "        return self._backend.send({v})",
        "        return self._backend.send({v}, timeout=self.timeout)",
        "drops the timeout argument when calling the backend",
    ),
    (
        "        self._cache[{v}] = compute({v})",
        "        with self._lock:\n            self._cache[{v}] = compute({v})",
        "updates a shared cache without holding the lock",
    ),
    (
        "    \"requires\": [\"setuptools<58\"]",
        "    \"requires\": [\"setuptools>=61\"]",
        "pins an incompatible setuptools version in the build configuration",
    ),
    (
        "    \"\"\"Return the value in seconds.\"\"\"",
        "    \"\"\"Return the value in milliseconds.\"\"\"",
        "documents the wrong unit in the docstring and error message",
    ),
];

/// Generates trajectory `j`, counting tokens with `count`.
pub fn trajectory(j: u64, count: &dyn Fn(&str) -> usize) -> (Trajectory, Vec<usize>) {
    let mut rng = Rng::row("agent_traces", j);
    let domain = rng.weighted(&DOMAIN_WEIGHTS);
    let root_cause = rng.weighted(&ROOT_WEIGHTS);
    let (projects, nouns) = domain_words(domain);
    let project = rng.pick(projects);
    let noun = rng.pick(nouns);
    let module = format!(
        "{}/{}",
        project.replace('-', "_"),
        rng.pick(&["core", "utils", "api", "io", "base", "models", "helpers"])
    );
    let file = format!("/testbed/{module}/{noun}s.py");
    let func = ident(&mut rng, noun);
    let other_files: Vec<String> = (0..6)
        .map(|_| {
            format!(
                "/testbed/{module}/{}.py",
                rng.pick(&[
                    "config", "errors", "compat", "registry", "cli", "types", "_version", "cache",
                    "session"
                ])
            )
        })
        .collect();
    let ctx = Ctx {
        project,
        module,
        file,
        func,
        noun,
        other_files,
        root_cause,
    };
    // Script over n turns.
    let n = rng.lognormal(25.0, 0.42, 8.0, 60.0) as usize;
    let mut acts = vec![Act::ViewDir];
    let repro_at = rng.range(2, 3);
    let locate_at = rng.range(3, 9);
    let fail_first = rng.chance(0.8);
    let gives_up = rng.chance(0.36);
    while acts.len() < n.saturating_sub(1) {
        let t = acts.len() + 1;
        let st_fix = acts.contains(&Act::FixEdit);
        let a = if t == repro_at {
            Act::CreateRepro
        } else if t == repro_at + 1 {
            Act::RunRepro
        } else if t < locate_at {
            if rng.chance(0.5) {
                Act::Search
            } else {
                Act::ViewOther
            }
        } else if t == locate_at {
            Act::ViewTarget
        } else if !st_fix && !gives_up {
            let last = *acts.last().unwrap();
            let wrong_done = acts.contains(&Act::WrongEdit);
            if fail_first && !wrong_done && rng.chance(0.45) {
                Act::WrongEdit
            } else if last == Act::WrongEdit {
                Act::RunRepro
            } else if wrong_done && last == Act::RunRepro && !acts.contains(&Act::Undo) {
                Act::Undo
            } else if (!fail_first && rng.chance(0.1))
                || (acts.contains(&Act::Undo) && rng.chance(0.3))
            {
                Act::FixEdit
            } else if rng.chance(0.5) {
                Act::Search
            } else {
                Act::ViewOther
            }
        } else if st_fix && *acts.last().unwrap() == Act::FixEdit {
            Act::RunRepro
        } else {
            match rng.below(5) {
                0 => Act::RunTests,
                1 => Act::RunRepro,
                2 => Act::Search,
                _ => Act::ViewOther,
            }
        };
        acts.push(a);
    }
    acts.push(Act::Finish);
    // Render.
    let mut messages = vec![format!("[SYSTEM]\n{SYSTEM_PROMPT}")];
    messages.push(format!("[USER]\n{}", issue(&mut rng, &ctx)));
    let mut turn_end = Vec::new();
    let mut states = Vec::new();
    let mut st = State::default();
    let bug = BUGS[ctx.root_cause];
    let v = rng.pick(&["value", "items", "key", "options"]);
    let buggy = bug.0.replace("{v}", v);
    let fixed = bug.1.replace("{v}", v);
    for (k, &a) in acts.iter().enumerate() {
        let (thought, call_s, reply, tool) = render(&mut rng, &ctx, a, &mut st, &buggy, &fixed, k);
        messages.push(format!("[ASSISTANT]\n{thought}\n\n{call_s}"));
        messages.push(format!(
            "[TOOL]\nExit code: {}\nExecution output of [{tool}]:\n{}",
            if matches!(st.last_run, Some(3)) && matches!(a, Act::RunRepro | Act::RunTests) {
                1
            } else {
                0
            },
            reply.trim_end()
        ));
        turn_end.push(messages.len());
        states.push(st);
    }
    // Tokens of each message followed by the "\n\n" separator (a separator can merge
    // with a message's last token, so it is counted in place).
    let counts: Vec<usize> = messages
        .iter()
        .map(|m| count(&format!("{m}\n\n")))
        .collect();
    (
        Trajectory {
            messages,
            turn_end,
            states,
            domain: domain as u8,
            root_cause: root_cause as u8,
        },
        counts,
    )
}

fn issue(rng: &mut Rng, ctx: &Ctx) -> String {
    let what = BUGS[ctx.root_cause].2;
    let mut s = format!(
        "<github_issue>\n`{}` {what}\n\n### Description\n\nWhen calling `{}.{}` with ",
        ctx.func,
        ctx.module.replace('/', "."),
        ctx.func
    );
    s.push_str(rng.pick(&[
        "an empty list",
        "a nested mapping",
        "a path with spaces",
        "unicode input",
        "the default options",
        "a large input",
    ]));
    s.push_str(", the result is wrong.");
    let extra = [
        "This used to work in the previous release, so it looks like a regression.",
        "I looked through the changelog but could not find anything related.",
        "The problem only shows up when the input comes from a configuration file.",
        "We hit this in production after upgrading, and had to pin the old version.",
        "I am happy to submit a pull request if someone can confirm the expected behaviour.",
        "The documentation suggests that this case should be supported.",
    ];
    for _ in 0..rng.range(2, 5) {
        push_sentence(&mut s, rng.pick(&extra));
    }
    s.push_str(&format!(
        "\n\n### Steps to reproduce\n\n```python\nfrom {} import {}\n\nresult = {}({})\nprint(result)\n```\n\n### Expected behavior\n\nThe call should return a valid {} without raising.\n\n### Actual behavior\n\n```\nTraceback (most recent call last):\n  File \"repro.py\", line 3, in <module>\n    result = {}({})\n  File \"{}\", line {}, in {}\n    {}\n{}: {}\n```\n\n### Environment\n\n- {} version: {}.{}.{}\n- Python: 3.{}\n- OS: {}\n</github_issue>",
        ctx.module.replace('/', "."),
        ctx.func,
        ctx.func,
        rng.pick(&["[]", "{'a': {'b': 1}}", "'my file.txt'", "'naïve'", "None", "list(range(10000))"]),
        ctx.noun,
        ctx.func,
        rng.pick(&["[]", "{}", "None"]),
        ctx.file,
        rng.range(40, 400),
        ctx.func,
        BUGS[ctx.root_cause].0.trim().replace("{v}", "value"),
        rng.pick(&["TypeError", "ValueError", "AttributeError", "IndexError", "KeyError"]),
        rng.pick(&["'NoneType' object is not subscriptable", "list index out of range", "unexpected keyword argument 'timeout'", "invalid literal for int()"]),
        ctx.project,
        rng.range(0, 4),
        rng.range(0, 30),
        rng.range(0, 9),
        rng.range(8, 12),
        rng.pick(&["Ubuntu 22.04", "macOS 14", "Windows 11", "Debian 12"])
    ));
    s
}

fn run_output(rng: &mut Rng, ctx: &Ctx, result: u8, tests: bool) -> String {
    let n = rng.range(8, 120);
    match result {
        0 => {
            if tests {
                format!(
                    "============================= test session starts ==============================\nplatform linux -- Python 3.10.14, pytest-8.1.1, pluggy-1.4.0\nrootdir: /testbed\ncollected {n} items\n\ntests/test_{}s.py {}\n\n============================== {n} passed in {}.{:02}s ==============================",
                    ctx.noun,
                    ".".repeat(n.min(70)),
                    rng.range(0, 9),
                    rng.below(100)
                )
            } else {
                format!(
                    "Testing {}...\nResult: OK\nAll checks passed: the issue is resolved.",
                    ctx.func
                )
            }
        }
        1 => format!(
            "Testing {}...\nTraceback (most recent call last):\n  File \"/testbed/reproduce_issue.py\", line {}, in <module>\n    result = {}(value)\n  File \"{}\", line {}, in {}\nValueError: invalid {}: None\nIssue still present: the bug reproduces.",
            ctx.func,
            rng.range(5, 30),
            ctx.func,
            ctx.file,
            rng.range(40, 400),
            ctx.func,
            ctx.noun
        ),
        2 => {
            let failed = rng.range(1, 4);
            format!(
                "============================= test session starts ==============================\ncollected {n} items\n\ntests/test_{}s.py ..F..{}\n\n=================================== FAILURES ===================================\n___________________________ test_{}_roundtrip ___________________________\n\n    def test_{}_roundtrip():\n>       assert {}(sample) == expected\nE       AssertionError: assert None == {{'name': 'x'}}\n\ntests/test_{}s.py:{}: AssertionError\n=========================== short test summary info ============================\nFAILED tests/test_{}s.py::test_{}_roundtrip\n========================= {failed} failed, {} passed in 1.{:02}s =========================\nThe originally reported case now works.",
                ctx.noun,
                ".".repeat(n.min(40)),
                ctx.noun,
                ctx.noun,
                ctx.func,
                ctx.noun,
                rng.range(10, 300),
                ctx.noun,
                ctx.noun,
                n - failed.min(n),
                rng.below(100)
            )
        }
        _ => format!(
            "Traceback (most recent call last):\n  File \"/testbed/reproduce_issue.py\", line 2, in <module>\n    from {} import {}\nModuleNotFoundError: No module named '{}'",
            ctx.module.replace('/', "."),
            ctx.func,
            rng.pick(&["yaml", "numpy", "requests", "lxml"])
        ),
    }
}

#[allow(clippy::too_many_arguments)]
fn render(
    rng: &mut Rng,
    ctx: &Ctx,
    a: Act,
    st: &mut State,
    buggy: &str,
    fixed: &str,
    k: usize,
) -> (String, String, String, &'static str) {
    let file = ctx.file.as_str();
    match a {
        Act::ViewDir => {
            let mut listing = format!(
                "Here's the files and directories up to 2 levels deep in /testbed, excluding hidden:\n/testbed\n/testbed/{}\n",
                ctx.project
            );
            for f in &ctx.other_files {
                listing.push_str(f);
                listing.push('\n');
            }
            for d in [
                "docs",
                "tests",
                "setup.py",
                "pyproject.toml",
                "README.rst",
                "CHANGELOG.md",
            ] {
                listing.push_str(&format!("/testbed/{d}\n"));
            }
            (
                "Let me start by exploring the repository structure to understand how the code is organized.".into(),
                call("file_editor", &[("command", "view"), ("path", "/testbed")]),
                listing,
                "file_editor",
            )
        }
        Act::Search => {
            let term = if rng.chance(0.5) {
                ctx.func.clone()
            } else {
                ident(rng, ctx.noun)
            };
            let m = rng.range(2, 14);
            let mut out = format!("Found {m} matches for \"{term}\" in /testbed:\n");
            for _ in 0..m {
                let f = rng.pick_ref(&ctx.other_files).clone();
                out.push_str(&format!("{f} ({} matches)\n", rng.range(1, 6)));
            }
            out.push_str(&format!("End of matches for \"{term}\" in /testbed"));
            (
                format!("Let me search for `{term}` to see where it is defined and used."),
                call("search", &[("search_term", &term), ("path", "/testbed")]),
                out,
                "search",
            )
        }
        Act::ViewOther | Act::ViewTarget => {
            let target = a == Act::ViewTarget;
            let path = if target {
                file.to_string()
            } else {
                rng.pick_ref(&ctx.other_files).clone()
            };
            let lines = rng.lognormal(66.0, 0.75, 8.0, 300.0) as usize;
            let start = rng.range(1, 300);
            let mut body = code_lines(rng, ctx, start, lines, target);
            if target {
                st.located = true;
                body.push_str(&format!(
                    "{:6}\t{}\n",
                    start + lines,
                    buggy.lines().next().unwrap_or("")
                ));
            }
            let thought = if target {
                format!(
                    "This looks like the relevant code: `{}` in `{file}` is where the {} is computed. Let me look at it closely.",
                    ctx.func, ctx.noun
                )
            } else {
                format!(
                    "Let me look at `{path}` to understand how the {} is handled.",
                    ctx.noun
                )
            };
            let range = format!("[{}, {}]", start, start + lines);
            (
                thought,
                call(
                    "file_editor",
                    &[("command", "view"), ("path", &path), ("view_range", &range)],
                ),
                format!("Here's the result of running `cat -n` on the file: {path}:\n{body}"),
                "file_editor",
            )
        }
        Act::CreateRepro => {
            let script = format!(
                "from {} import {}\n\n\ndef main():\n    print(\"Testing {}...\")\n    result = {}(None)\n    assert result is not None, \"Issue still present\"\n    print(\"Result: OK\")\n\n\nif __name__ == \"__main__\":\n    main()",
                ctx.module.replace('/', "."),
                ctx.func,
                ctx.func,
                ctx.func
            );
            (
                "Now let me create a script to reproduce the issue described in the report.".into(),
                call("file_editor", &[("command", "create"), ("path", "/testbed/reproduce_issue.py"), ("file_text", &script)]),
                "File created at /testbed/reproduce_issue.py. Here's the result of running `cat -n` on /testbed/reproduce_issue.py:\n     1\tfrom ...\nReview the file and make sure that it is as expected. Edit the file if necessary.".into(),
                "file_editor",
            )
        }
        Act::RunRepro | Act::RunTests => {
            let tests = a == Act::RunTests;
            let result: u8 = if st.fix {
                let x = rng.f64();
                if x < 0.72 {
                    0
                } else if x < 0.84 {
                    2
                } else if x < 0.94 {
                    3
                } else {
                    1
                }
            } else if rng.chance(0.15) {
                3
            } else {
                1
            };
            let result = if !tests && result == 2 { 0 } else { result };
            st.last_run = Some(result);
            if st.edit_active {
                st.run_after_edit = Some(result == 0);
            }
            if !st.fix && st.edit_active {
                st.failed_approach = true;
            }
            let cmd = if tests {
                format!(
                    "cd /testbed && python -m pytest tests/test_{}s.py -q",
                    ctx.noun
                )
            } else {
                "cd /testbed && python reproduce_issue.py".into()
            };
            let thought = if tests {
                "Let me run the existing test suite to make sure nothing else is broken."
                    .to_string()
            } else if st.edit_active {
                "Let me run the reproduction script again to check whether the change fixed the issue.".to_string()
            } else {
                "Let me run the script to confirm that the issue reproduces.".to_string()
            };
            (
                thought,
                call("execute_bash", &[("cmd", &cmd)]),
                run_output(rng, ctx, result, tests),
                "execute_bash",
            )
        }
        Act::WrongEdit => {
            st.edit_active = true;
            st.run_after_edit = None;
            let old = buggy.lines().next().unwrap_or("").to_string();
            let new = format!("{old}  # handle edge case\n        value = value or {{}}");
            (
                "I think the problem might be that the input is not normalized. Let me try normalizing it before it is used.".into(),
                call("file_editor", &[("command", "str_replace"), ("path", file), ("old_str", &old), ("new_str", &new)]),
                format!("The file {file} has been edited. Here's the result of running `cat -n` on a snippet of {file}:\n{}Review the changes and make sure they are as expected.", code_lines(rng, ctx, 100 + k, 12, false)),
                "file_editor",
            )
        }
        Act::Undo => {
            st.edit_active = false;
            st.run_after_edit = None;
            (
                "That change did not fix the issue; the normalization was the wrong idea. Let me revert it and look at the logic more carefully.".into(),
                call("file_editor", &[("command", "undo_edit"), ("path", file)]),
                format!("Last edit to {file} undone successfully."),
                "file_editor",
            )
        }
        Act::FixEdit => {
            if st.failed_approach {
                st.recovered = true;
            }
            st.edit_active = true;
            st.fix = true;
            st.run_after_edit = None;
            (
                format!(
                    "I see the real problem now: the code {}. Let me fix that directly.",
                    BUGS[ctx.root_cause].2
                ),
                call(
                    "file_editor",
                    &[
                        ("command", "str_replace"),
                        ("path", file),
                        ("old_str", buggy),
                        ("new_str", fixed),
                    ],
                ),
                format!(
                    "The file {file} has been edited. Here's the result of running `cat -n` on a snippet of {file}:\n{}Review the changes and make sure they are as expected.",
                    code_lines(rng, ctx, 100 + k, 14, false)
                ),
                "file_editor",
            )
        }
        Act::Finish => {
            let msg = if st.fix {
                "I fixed the issue and verified it with the reproduction script."
            } else {
                "I was not able to fully resolve the issue."
            };
            (
                "I have done what I can for this issue; let me submit.".into(),
                call("finish", &[("command", "submit"), ("result", msg)]),
                "<<<Finished>>>".into(),
                "finish",
            )
        }
    }
}

impl Trajectory {
    /// Snapshots of this trajectory (every 5th assistant turn) whose token count is at most `cap`.
    pub fn snapshots(
        &self,
        j: u32,
        counts: &[usize],
        count: &dyn Fn(&str) -> usize,
        cap: usize,
    ) -> Vec<(Snapshot, usize)> {
        let mut out = Vec::new();
        let mut before_last = 0usize;
        let mut upto = 0usize;
        for (k, &end) in self.turn_end.iter().enumerate() {
            while upto + 1 < end {
                before_last += counts[upto];
                upto += 1;
            }
            let turn = k + 1;
            if turn % 5 != 0 {
                continue;
            }
            let tokens = before_last + count(&self.messages[end - 1]);
            if tokens > cap {
                break;
            }
            let st = self.states[k];
            let progress = if !st.edit_active {
                if st.located { 1 } else { 0 }
            } else {
                match st.run_after_edit {
                    None => 2,
                    Some(true) => 3,
                    Some(false) => 4,
                }
            };
            out.push((
                Snapshot {
                    trajectory: j,
                    turn: turn as u32,
                    tokens: tokens as u32,
                    recovered: st.recovered,
                    implemented_fix: st.fix,
                    progress,
                    test_result: st.last_run.unwrap_or(1),
                    domain: self.domain,
                    root_cause: self.root_cause,
                },
                end,
            ));
        }
        out
    }

    /// The text of the first `m` messages.
    pub fn text(&self, m: usize) -> String {
        self.messages[..m].join("\n\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshots_are_prefixes_with_consistent_states() {
        let count = |s: &str| s.len() / 3;
        for j in 0..20 {
            let (t, c) = trajectory(j, &count);
            let snaps = t.snapshots(j as u32, &c, &count, 24_000);
            let texts: Vec<String> = snaps.iter().map(|(_, m)| t.text(*m)).collect();
            for w in texts.windows(2) {
                assert!(w[1].starts_with(&w[0]));
            }
            for (s, _) in &snaps {
                assert!(s.turn % 5 == 0 && s.tokens <= 24_000);
                if s.progress >= 2 {
                    assert!(s.test_result < 4);
                }
            }
            assert!(!t.text(t.messages.len()).contains("{v}"));
        }
    }
}
