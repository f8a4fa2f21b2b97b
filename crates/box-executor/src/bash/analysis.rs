//! The bash line analysis behind the facts claim and the stamp: what a line
//! would touch, answered without running it, and never less than it can.
//!
//! Two readings of a line:
//! - The **safe subset** (`lex`): words of a small character set, quotes
//!   without expansions, `&&` and `|`, the trailing redirects `2>&1`,
//!   `2>/dev/null`, `>/dev/null`. Such a line runs exactly the words it shows,
//!   so each stage is a call of its own. A stage of the read-only list (git's
//!   read-only subcommands, `ls`, `pwd`, `go version|env`, `cat head tail wc
//!   grep`, and after `|` also `sort uniq cut`) is checked (flags, paths inside
//!   the workspace, no `..`) and claims a `read` (or `ls`) per file it names.
//!   A line whose every stage passes is auto-allowable: its rewrite carries a
//!   stamp over the rendered plan (every word single-quoted, `--no-ext-diff
//!   --no-textconv` after `git diff|log|show`) and what it reads, links
//!   followed; the stamped run executes that plan, not the line.
//! - Anything else goes to the **splitter** (`split`): a best-effort cut at
//!   `;`, newline, `|`, `&`, `&&`, `||`, following quotes, `$'..'`, escapes
//!   and comments. Each part is a call, each redirect target a `write` (or a
//!   `read` for `<`), and the whole line is added with the sentinel prefix, so
//!   no rule for a command covers it. A line with file redirects gets a stamp
//!   over the line and where its redirects lead; its stamped run executes the
//!   line as typed only while they still lead there.
//!
//! `*`/`?` are allowed in `ls` arguments only: the analysis expands them as
//! bash would (in the C and the UTF-8 locale both) and checks every name, and
//! the plan lists the names after a `--`. `cd` is only `cd DIR && …`.
//!
//! Git stages are auto-allowable only when the repository's own configuration
//! (the local, worktree and included scopes) names no program and moves
//! nothing (the dax probe of section 5.2), and its `.git` is a plain
//! directory. Every run is neutralised besides (`scrub`); a stamped run also
//! gets the filter, diff and merge drivers (and `diff.external`) of every
//! repository its git stages can reach overridden: the one each stage runs
//! in (after its `cd`s) and every populated submodule or embedded repository
//! that one's index names, which `git status` and `git diff` look inside with
//! their own configuration. A line outside the subset runs as typed, so which
//! repository its git enters (`-C`, `cd`, `GIT_DIR`, a `.git` file) cannot be
//! said: a line that names git is not stamped at all.

use std::os::unix::ffi::OsStrExt as _;
use std::path::{Component, Path, PathBuf};

use serde_json::{Map, Value};

use super::super::Context;
use super::super::facts::{FactCall, Facts, SENTINEL};
use box_scrub::Drivers;

/// What a stamped line runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The bash line to run: the rendered plan, or the line as typed for a
    /// stamped line outside the subset.
    pub rendered: String,
    /// The drivers the repositories it can reach define, to override.
    pub drivers: Drivers,
}

/// The facts claim of a bash line.
pub(crate) fn facts(
    context: &Context,
    command: &str,
    arguments: &Map<String, Value>,
) -> Result<Facts, String> {
    let analysis = analyse(context, command)?;
    let rewrite = match &analysis.signed {
        Some(message) => {
            let mut rewrite = arguments.clone();
            rewrite.insert(
                "dax_stamp".to_owned(),
                Value::String(context.stamp.sign(message.as_bytes())),
            );
            Some(rewrite)
        }
        None if arguments.contains_key("dax_stamp") => {
            let mut rewrite = arguments.clone();
            rewrite.remove("dax_stamp");
            Some(rewrite)
        }
        None => None,
    };
    Ok(Facts {
        calls: Some(analysis.calls),
        rewrite,
    })
}

/// The plan of `command` if its analysis still signs to `stamp`.
pub(crate) fn verify(context: &Context, command: &str, stamp: &str) -> Option<Plan> {
    let analysis = analyse(context, command).ok()?;
    let message = analysis.signed?;
    if !context.stamp.verify(message.as_bytes(), stamp) {
        return None;
    }
    let drivers = analysis.drivers;
    analysis.run.map(|rendered| Plan { rendered, drivers })
}

/// One analysis: the calls, and for a stampable line what is signed and what runs.
#[derive(Debug)]
struct Analysis {
    calls: Vec<FactCall>,
    signed: Option<String>,
    run: Option<String>,
    /// What the repositories a stamped run can reach define.
    drivers: Drivers,
}

fn analyse(context: &Context, command: &str) -> Result<Analysis, String> {
    if command.trim().is_empty() {
        return Err("empty command".to_owned());
    }
    if let Some(tokens) = lex(command) {
        return Ok(analyse_subset(context, command, &tokens));
    }
    analyse_split(context, command)
}

// ---------------------------------------------------------------------------
// The safe subset.

/// A token of the safe subset.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    /// A word: its value after quote removal, whether an unquoted `*`/`?`
    /// made it a glob, and its byte span in the line.
    Word {
        value: String,
        glob: bool,
        span: (usize, usize),
    },
    /// `&&`.
    And,
    /// `|`.
    Pipe,
    /// One of the trailing redirects, as written.
    Redirect {
        text: &'static str,
        span: (usize, usize),
    },
}

/// Characters of an unquoted word.
fn is_word_char(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"_./:@%+,=-".contains(&byte)
}

/// The redirects a subset stage may end with.
const TRAILING: &[&str] = &["2>&1", "2>/dev/null", ">/dev/null"];

/// Cut a line into subset tokens, or `None` when it is outside the subset.
fn lex(line: &str) -> Option<Vec<Token>> {
    let bytes = line.as_bytes();
    if bytes
        .iter()
        .any(|byte| !(0x20..0x7f).contains(byte) && *byte != b'\t')
    {
        return None;
    }
    let mut tokens = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        match bytes[at] {
            b' ' | b'\t' => at += 1,
            b'&' if bytes.get(at + 1) == Some(&b'&') => {
                tokens.push(Token::And);
                at += 2;
            }
            b'|' if bytes.get(at + 1) != Some(&b'|') && bytes.get(at + 1) != Some(&b'&') => {
                tokens.push(Token::Pipe);
                at += 1;
            }
            _ => {
                if let Some(text) = TRAILING.iter().find(|text| {
                    line[at..].starts_with(**text)
                        && matches!(
                            bytes.get(at + text.len()),
                            None | Some(b' ' | b'\t' | b'&' | b'|')
                        )
                }) {
                    tokens.push(Token::Redirect {
                        text,
                        span: (at, at + text.len()),
                    });
                    at += text.len();
                    continue;
                }
                let (token, next) = lex_word(line, at)?;
                if next == at {
                    return None;
                }
                tokens.push(token);
                at = next;
            }
        }
    }
    Some(tokens)
}

/// One subset word starting at `start`.
fn lex_word(line: &str, start: usize) -> Option<(Token, usize)> {
    let bytes = line.as_bytes();
    let mut value = String::new();
    let mut glob = false;
    let mut at = start;
    while at < bytes.len() {
        let byte = bytes[at];
        match byte {
            b' ' | b'\t' | b'&' | b'|' => break,
            b'\'' | b'"' => {
                let close = line[at + 1..].find(byte as char)? + at + 1;
                let inner = &line[at + 1..close];
                if byte == b'"' && inner.contains(['$', '`', '\\']) {
                    return None;
                }
                value.push_str(inner);
                at = close + 1;
            }
            b'~' | b'^' if at > start => {
                value.push(byte as char);
                at += 1;
            }
            b'*' | b'?' => {
                glob = true;
                value.push(byte as char);
                at += 1;
            }
            _ if is_word_char(byte) => {
                value.push(byte as char);
                at += 1;
            }
            _ => return None,
        }
    }
    Some((
        Token::Word {
            value,
            glob,
            span: (start, at),
        },
        at,
    ))
}

/// A stage: its words and trailing redirects, and the text as written.
#[derive(Debug)]
struct Stage<'a> {
    words: Vec<(String, bool)>,
    redirects: Vec<&'static str>,
    text: &'a str,
    piped: bool,
}

impl Stage<'_> {
    /// The words joined by single spaces, redirects included: what a rule sees.
    fn joined(&self) -> String {
        let mut parts: Vec<&str> = self.words.iter().map(|(word, _)| word.as_str()).collect();
        parts.extend(self.redirects.iter().copied());
        parts.join(" ")
    }
}

/// Group tokens into `&&`-separated segments of `|`-separated stages; `None`
/// when the structure is not the subset's (an empty stage, a redirect before
/// a word, a word after a redirect).
fn structure<'a>(line: &'a str, tokens: &[Token]) -> Option<Vec<Vec<Stage<'a>>>> {
    let mut segments = vec![Vec::new()];
    let mut current: Option<Stage<'a>> = None;
    let mut piped = false;
    for token in tokens {
        match token {
            Token::Word { value, glob, span } => {
                let stage = current.get_or_insert_with(|| Stage {
                    words: Vec::new(),
                    redirects: Vec::new(),
                    text: &line[span.0..span.1],
                    piped,
                });
                if !stage.redirects.is_empty() {
                    return None;
                }
                stage.words.push((value.clone(), *glob));
                stage.text = extend(line, stage.text, span.1);
            }
            Token::Redirect { text, span } => {
                let stage = current.as_mut()?;
                stage.redirects.push(text);
                stage.text = extend(line, stage.text, span.1);
            }
            Token::And | Token::Pipe => {
                segments.last_mut()?.push(current.take()?);
                piped = *token == Token::Pipe;
                if !piped {
                    segments.push(Vec::new());
                }
            }
        }
    }
    segments.last_mut()?.push(current.take()?);
    Some(segments)
}

/// `text` (a slice of `line`) extended to end at byte `end`.
fn extend<'a>(line: &'a str, text: &'a str, end: usize) -> &'a str {
    let start = text.as_ptr() as usize - line.as_ptr() as usize;
    &line[start..end]
}

/// Where a stage runs: root-relative (`""` = the root) and absolute.
#[derive(Debug, Clone)]
struct Base {
    relative: String,
    absolute: PathBuf,
}

fn analyse_subset(context: &Context, line: &str, tokens: &[Token]) -> Analysis {
    let Some(segments) = structure(line, tokens) else {
        return Analysis {
            calls: vec![sentinel_call(line, "not a simple command line")],
            signed: None,
            run: None,
            drivers: Drivers::default(),
        };
    };
    let root = context.workspace.root();
    let mut base = Base {
        relative: String::new(),
        absolute: root.to_path_buf(),
    };
    let mut calls = Vec::new();
    let mut allowable = true;
    let mut rendered_segments = Vec::new();
    let mut signed_reads = String::new();
    let mut drivers = Drivers::default();
    let last = segments.len() - 1;
    for (index, segment) in segments.iter().enumerate() {
        let first = &segment[0];
        if first.words[0].0 == "cd" {
            match check_cd(context, &base, segment, index == last) {
                Ok(next) => {
                    rendered_segments.push(format!("cd {}", quote(&first.words[1].0)));
                    signed_reads.push_str(&format!("cd\0{}\0", next.absolute.display()));
                    base = next;
                }
                Err(why) => {
                    allowable = false;
                    calls.push(stage_sentinel(first, &why));
                }
            }
            continue;
        }
        let mut rendered_stages = Vec::new();
        for stage in segment {
            match check_stage(context, &base, stage, &mut drivers) {
                Checked::ReadOnly { reads, rendered } => {
                    calls.push(stage_call(stage));
                    for (tool, raw) in reads {
                        for mut call in context.workspace.word_facts(&base.relative, &raw, tool) {
                            let verb = if tool == "ls" { "lists" } else { "reads" };
                            call.text = format!("{}  [{verb} {}]", stage.text, call.text);
                            calls.push(call);
                        }
                        signed_reads.push_str(&format!(
                            "{tool}\0{}\0",
                            resolved(&base.absolute.join(&raw)).display()
                        ));
                    }
                    rendered_stages.push(rendered.unwrap_or_else(|| render_stage(stage)));
                }
                Checked::Other => {
                    allowable = false;
                    calls.push(stage_call(stage));
                }
                Checked::Refused(why) => {
                    allowable = false;
                    calls.push(stage_sentinel(stage, &why));
                }
            }
        }
        rendered_segments.push(rendered_stages.join(" | "));
    }
    if !allowable {
        return Analysis {
            calls,
            signed: None,
            run: None,
            drivers,
        };
    }
    let rendered = rendered_segments.join(" && ");
    let mut facts_text = String::new();
    for call in &calls {
        facts_text.push_str(&call.tool);
        facts_text.push('\0');
        facts_text.push_str(&Value::Object(call.args.clone()).to_string());
        facts_text.push('\0');
    }
    facts_text.push_str(&signed_reads);
    Analysis {
        calls,
        signed: Some(format!("plan\0{rendered}\0{facts_text}")),
        run: Some(rendered),
        drivers,
    }
}

/// A path with links resolved where it exists, as written otherwise: what a
/// stamp signs so that a link changing after the stamp breaks it.
fn resolved(path: &Path) -> PathBuf {
    path.canonicalize().unwrap_or_else(|_| path.to_path_buf())
}

fn stage_call(stage: &Stage<'_>) -> FactCall {
    FactCall {
        tool: String::new(),
        args: command_args(stage.joined()),
        text: stage.text.to_owned(),
    }
}

fn stage_sentinel(stage: &Stage<'_>, why: &str) -> FactCall {
    FactCall {
        tool: String::new(),
        args: command_args(format!("{SENTINEL}{}", stage.text)),
        text: format!("{}  [{why}]", stage.text),
    }
}

fn sentinel_call(line: &str, why: &str) -> FactCall {
    FactCall {
        tool: String::new(),
        args: command_args(format!("{SENTINEL}{line}")),
        text: if why.is_empty() {
            line.to_owned()
        } else {
            format!("{line}  [{why}]")
        },
    }
}

fn command_args(command: String) -> Map<String, Value> {
    let mut args = Map::new();
    args.insert("command".to_owned(), Value::String(command));
    args
}

/// Single-quote a word for bash.
fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

fn render_stage(stage: &Stage<'_>) -> String {
    let mut words: Vec<String> = Vec::new();
    for (index, (word, _)) in stage.words.iter().enumerate() {
        words.push(quote(word));
        if index == 1
            && stage.words[0].0 == "git"
            && matches!(word.as_str(), "diff" | "log" | "show")
        {
            words.push("--no-ext-diff".to_owned());
            words.push("--no-textconv".to_owned());
        }
    }
    words.extend(stage.redirects.iter().map(|text| (*text).to_owned()));
    words.join(" ")
}

/// The files a stage reads (`read`) or lists (`ls`), as written.
type Reads = Vec<(&'static str, String)>;

/// The verdict on one stage.
#[derive(Debug, PartialEq, Eq)]
enum Checked {
    /// A read-only command whose arguments passed: the files it reads or
    /// lists, and its rendering when it is not the words as written (`ls`
    /// with its globs expanded).
    ReadOnly {
        reads: Reads,
        rendered: Option<String>,
    },
    /// A command outside the read-only list: a call of its own for the policy.
    Other,
    /// A read-only command whose arguments failed the check, and why.
    Refused(String),
}

/// `cd DIR && …`: DIR a directory inside the workspace, not the last segment.
fn check_cd(
    context: &Context,
    base: &Base,
    segment: &[Stage<'_>],
    last: bool,
) -> Result<Base, String> {
    let stage = &segment[0];
    if segment.len() > 1 || last || stage.words.len() != 2 || !stage.redirects.is_empty() {
        return Err("cd only as `cd DIR && …`".to_owned());
    }
    let raw = &stage.words[1].0;
    if stage.words[1].1 {
        return Err("a glob in cd".to_owned());
    }
    let absolute = inside(context, base, raw)?;
    if !absolute.is_dir() {
        return Err(format!("{raw} is not a directory in the workspace"));
    }
    let root = context.workspace.root();
    let relative = lexical(&base.absolute.join(raw))
        .strip_prefix(root)
        .map(|path| path.to_string_lossy().into_owned())
        .map_err(|_| format!("{raw} is outside the workspace"))?;
    Ok(Base {
        relative,
        absolute: lexical(&base.absolute.join(raw)),
    })
}

/// Clean `.` and repeated separators without touching the file system.
fn lexical(path: &Path) -> PathBuf {
    path.components()
        .filter(|component| !matches!(component, Component::CurDir))
        .collect()
}

/// A path argument inside the workspace: no `..`, not absolute elsewhere,
/// and (where it exists) not leading out through a link. The absolute path.
fn inside(context: &Context, base: &Base, raw: &str) -> Result<PathBuf, String> {
    let path = Path::new(raw);
    if path
        .components()
        .any(|component| component == Component::ParentDir)
    {
        return Err(format!("a .. in {raw}"));
    }
    let root = context.workspace.root();
    let joined = lexical(&base.absolute.join(path));
    if !joined.starts_with(root) {
        return Err(format!("{raw} is outside the workspace"));
    }
    if joined.symlink_metadata().is_ok() {
        let real_root = resolved(root);
        let real = joined
            .canonicalize()
            .map_err(|error| format!("where {raw} leads cannot be read: {error}"))?;
        if !real.starts_with(&real_root) {
            return Err(format!("{raw} leads out of the workspace"));
        }
        return Ok(real);
    }
    Ok(joined)
}

/// A file a read-only command reads: inside, a regular file, small enough.
fn readable(context: &Context, base: &Base, raw: &str) -> Result<(), String> {
    let path = inside(context, base, raw)?;
    let metadata = std::fs::metadata(&path).map_err(|_| format!("{raw} does not exist"))?;
    if !metadata.is_file() {
        return Err(format!("{raw} is not a regular file"));
    }
    if metadata.len() > context.max_read_bytes {
        return Err(format!(
            "{raw} is larger than {} bytes",
            context.max_read_bytes
        ));
    }
    Ok(())
}

/// Check one stage; a git stage adds what the repositories it reaches define
/// to `drivers`.
fn check_stage(
    context: &Context,
    base: &Base,
    stage: &Stage<'_>,
    drivers: &mut Drivers,
) -> Checked {
    let words: Vec<&str> = stage.words.iter().map(|(word, _)| word.as_str()).collect();
    let name = words[0];
    if name.contains('=') {
        return Checked::Other;
    }
    if stage.words.iter().skip(1).any(|(_, glob)| *glob) {
        if name == "ls" && !stage.piped && !stage.words[0].1 {
            return match check_ls_globs(context, base, stage) {
                Ok((reads, rendered)) => Checked::ReadOnly {
                    reads,
                    rendered: Some(rendered),
                },
                Err(why) => Checked::Refused(why),
            };
        }
        // Globs would be expanded by bash, past what this analysis saw.
        return match name {
            "ls" | "cat" | "head" | "tail" | "wc" | "grep" | "git" => {
                Checked::Refused("a glob".to_owned())
            }
            _ => Checked::Other,
        };
    }
    if stage.words[0].1 {
        return Checked::Other;
    }
    let args = &words[1..];
    let result = match (name, stage.piped) {
        ("git", false) => check_git(context, base, args, drivers),
        ("ls", false) => check_ls(context, base, args),
        ("pwd", false) if args.is_empty() => Ok(Vec::new()),
        ("go", false) => check_go(args),
        ("cat" | "head" | "tail" | "wc" | "grep", _) => check_reader(context, base, name, args),
        ("sort" | "uniq" | "cut", true) => check_reader(context, base, name, args),
        _ => return Checked::Other,
    };
    match result {
        Ok(reads) => Checked::ReadOnly {
            reads,
            rendered: None,
        },
        Err(why) => Checked::Refused(why),
    }
}

/// The most names one `ls` glob may expand to before the stage asks instead.
const MAX_GLOB_MATCHES: usize = 1000;

/// `ls` with globs: the analysis expands them itself (as bash would, in the
/// C and the UTF-8 locale both, hidden names only for a pattern starting with
/// `.`), checks every name, and renders the plan with the names after a `--`
/// so none can be read as an option. A glob matching nothing stays as
/// written, as bash leaves it.
fn check_ls_globs(
    context: &Context,
    base: &Base,
    stage: &Stage<'_>,
) -> Result<(Reads, String), String> {
    let mut flags = Vec::new();
    let mut operands = Vec::new();
    let mut options = true;
    for (word, glob) in &stage.words[1..] {
        if *glob {
            let matches = expand_glob(&base.absolute, word)?;
            if matches.is_empty() {
                operands.push(word.clone());
            } else {
                operands.extend(matches);
            }
        } else if options && word == "--" {
            options = false;
        } else if options && word.starts_with('-') && word.len() > 1 {
            flags.push(word.as_str());
        } else {
            operands.push(word.clone());
        }
    }
    check_ls(context, base, &flags)?;
    let mut reads = Vec::new();
    for operand in &operands {
        inside(context, base, operand)?;
        reads.push(("ls", operand.clone()));
    }
    let mut words = vec![quote("ls")];
    words.extend(flags.iter().map(|flag| quote(flag)));
    words.push("--".to_owned());
    words.extend(operands.iter().map(|operand| quote(operand)));
    words.extend(stage.redirects.iter().map(|text| (*text).to_owned()));
    Ok((reads, words.join(" ")))
}

/// The names `pattern` (relative, `*` and `?` only) matches beneath `dir`,
/// relative to it, sorted.
fn expand_glob(dir: &Path, pattern: &str) -> Result<Vec<String>, String> {
    if pattern.starts_with('/') {
        return Err(format!("the absolute glob {pattern}"));
    }
    let mut found = vec![String::new()];
    for component in pattern.split('/') {
        if component.is_empty() {
            continue;
        }
        let mut next = Vec::new();
        for prefix in &found {
            let joined = |name: &str| {
                if prefix.is_empty() {
                    name.to_owned()
                } else {
                    format!("{prefix}/{name}")
                }
            };
            if !component.contains(['*', '?']) {
                next.push(joined(component));
                continue;
            }
            let Ok(entries) = std::fs::read_dir(dir.join(prefix)) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name();
                let bytes = std::os::unix::ffi::OsStrExt::as_bytes(name.as_os_str());
                if bytes.first() == Some(&b'.') && !component.starts_with('.') {
                    continue;
                }
                let text = String::from_utf8_lossy(bytes);
                let chars: Vec<char> = text.chars().collect();
                if !glob_matches(component.as_bytes(), bytes)
                    && !glob_matches(component.as_bytes(), &chars)
                {
                    continue;
                }
                let Some(name) = name.to_str() else {
                    return Err(format!("{pattern} matches a name that is not UTF-8"));
                };
                next.push(joined(name));
                if next.len() > MAX_GLOB_MATCHES {
                    return Err(format!(
                        "{pattern} matches more than {MAX_GLOB_MATCHES} names"
                    ));
                }
            }
        }
        found = next;
    }
    // Every literal component must exist for bash to keep the match.
    found.retain(|name| !name.is_empty() && dir.join(name).symlink_metadata().is_ok());
    found.sort();
    Ok(found)
}

/// A `*`/`?` pattern over bytes or characters (`?` is one unit of either).
fn glob_matches<T: Copy + Into<u32>>(pattern: &[u8], name: &[T]) -> bool {
    match pattern.split_first() {
        None => name.is_empty(),
        Some((b'*', rest)) => (0..=name.len()).any(|skip| glob_matches(rest, &name[skip..])),
        Some((b'?', rest)) => !name.is_empty() && glob_matches(rest, &name[1..]),
        Some((literal, rest)) => name.split_first().is_some_and(|(first, tail)| {
            (*first).into() == u32::from(*literal) && glob_matches(rest, tail)
        }),
    }
}

fn check_ls(context: &Context, base: &Base, args: &[&str]) -> Result<Reads, String> {
    let mut paths = Vec::new();
    let mut options = true;
    for arg in args {
        if options && *arg == "--" {
            options = false;
        } else if options && arg.starts_with('-') && arg.len() > 1 {
            let flag = arg.split('=').next().unwrap_or(arg);
            let long_ok = matches!(
                flag,
                "--all"
                    | "--almost-all"
                    | "--long"
                    | "--human-readable"
                    | "--classify"
                    | "--recursive"
                    | "--reverse"
                    | "--size"
                    | "--directory"
                    | "--color"
                    | "--group-directories-first"
                    | "--sort"
                    | "--time-style"
                    | "--full-time"
                    | "--inode"
                    | "--numeric-uid-gid"
                    | "--no-group"
                    | "--indicator-style"
            );
            let short_ok = !arg.starts_with("--")
                && arg[1..]
                    .bytes()
                    .all(|byte| b"aAlhFrRtSsd1igGnopcuUvXx".contains(&byte));
            if !long_ok && !short_ok {
                return Err(format!("ls option {arg}"));
            }
        } else {
            inside(context, base, arg)?;
            paths.push(("ls", (*arg).to_owned()));
        }
    }
    if paths.is_empty() {
        paths.push(("ls", ".".to_owned()));
    }
    Ok(paths)
}

fn check_go(args: &[&str]) -> Result<Reads, String> {
    match args {
        ["version"] => Ok(Vec::new()),
        ["env", names @ ..]
            if !names.is_empty()
                && names.iter().all(|name| {
                    name.bytes().all(|byte| {
                        byte.is_ascii_uppercase() || byte.is_ascii_digit() || byte == b'_'
                    })
                }) =>
        {
            Ok(Vec::new())
        }
        _ => Err("only `go version` and `go env NAME`".to_owned()),
    }
}

/// cat, head, tail, wc, grep, sort, uniq, cut: allow-listed flags; the other
/// arguments are files read (grep's first is its pattern unless `-e` gave one).
fn check_reader(
    context: &Context,
    base: &Base,
    name: &str,
    args: &[&str],
) -> Result<Reads, String> {
    // Letters that take no value, and letters whose value follows.
    let (plain, valued): (&[u8], &[u8]) = match name {
        "cat" => (b"AbeEnstTuv", b""),
        "head" | "tail" => (b"qvz", b"nc"),
        "wc" => (b"clmwL", b""),
        "grep" => (b"EFGPiyvwxcLlnhHoqsIabTUZz", b"emABC"),
        "sort" => (b"bdfghiMnRrsuVz", b"kt"),
        "uniq" => (b"cdDiuz", b"fsw"),
        "cut" => (b"snz", b"bcdf"),
        _ => (b"", b""),
    };
    let mut files = Vec::new();
    let mut pattern_given = false;
    let mut options = true;
    let mut index = 0;
    while index < args.len() {
        let arg = args[index];
        index += 1;
        if options && arg == "--" {
            options = false;
            continue;
        }
        if options && arg.starts_with("--") {
            let flag = arg.split('=').next().unwrap_or(arg);
            let ok = match name {
                "cat" => matches!(
                    flag,
                    "--number" | "--number-nonblank" | "--show-all" | "--squeeze-blank"
                ),
                "head" | "tail" => matches!(flag, "--lines" | "--bytes" | "--quiet" | "--verbose"),
                "wc" => matches!(
                    flag,
                    "--lines" | "--words" | "--bytes" | "--chars" | "--max-line-length"
                ),
                "grep" => matches!(
                    flag,
                    "--ignore-case"
                        | "--invert-match"
                        | "--word-regexp"
                        | "--line-regexp"
                        | "--count"
                        | "--files-with-matches"
                        | "--files-without-match"
                        | "--line-number"
                        | "--no-filename"
                        | "--with-filename"
                        | "--only-matching"
                        | "--quiet"
                        | "--silent"
                        | "--extended-regexp"
                        | "--fixed-strings"
                        | "--perl-regexp"
                        | "--color"
                        | "--colour"
                        | "--max-count"
                        | "--context"
                        | "--after-context"
                        | "--before-context"
                        | "--text"
                ),
                "sort" => matches!(
                    flag,
                    "--reverse"
                        | "--numeric-sort"
                        | "--unique"
                        | "--human-numeric-sort"
                        | "--version-sort"
                        | "--ignore-case"
                        | "--key"
                        | "--field-separator"
                ),
                "uniq" => matches!(
                    flag,
                    "--count" | "--repeated" | "--unique" | "--ignore-case"
                ),
                "cut" => matches!(
                    flag,
                    "--delimiter"
                        | "--fields"
                        | "--characters"
                        | "--bytes"
                        | "--complement"
                        | "--only-delimited"
                ),
                _ => false,
            };
            if !ok {
                return Err(format!("{name} option {arg}"));
            }
            continue;
        }
        if options && arg.starts_with('-') && arg.len() > 1 {
            let letters = &arg.as_bytes()[1..];
            if (name == "head" || name == "tail") && letters.iter().all(u8::is_ascii_digit) {
                continue;
            }
            let mut at = 0;
            while at < letters.len() {
                let letter = letters[at];
                if plain.contains(&letter) {
                    at += 1;
                } else if valued.contains(&letter) {
                    if name == "grep" && letter == b'e' {
                        pattern_given = true;
                    }
                    if at + 1 == letters.len() {
                        // The value is the next word.
                        if index >= args.len() {
                            return Err(format!("{name} option {arg} without its value"));
                        }
                        index += 1;
                    }
                    at = letters.len();
                } else {
                    return Err(format!("{name} option -{}", letter as char));
                }
            }
            continue;
        }
        if name == "grep" && !pattern_given {
            pattern_given = true;
            continue;
        }
        files.push(arg);
    }
    if name == "uniq" && files.len() > 1 {
        return Err("uniq with an output file".to_owned());
    }
    let mut reads = Vec::new();
    for file in files {
        readable(context, base, file)?;
        reads.push(("read", file.to_owned()));
    }
    Ok(reads)
}

/// git's read-only subcommands.
const GIT_READ_ONLY: &[&str] = &[
    "status",
    "diff",
    "log",
    "show",
    "branch",
    "rev-parse",
    "ls-files",
    "remote",
    "blame",
    "stash",
    "tag",
    "describe",
    "shortlog",
    "config",
];

/// Flag names (before any `=`) git's read-only subcommands may carry.
const GIT_FLAGS: &[&str] = &[
    "--patch",
    "--stat",
    "--numstat",
    "--shortstat",
    "--name-only",
    "--name-status",
    "--oneline",
    "--graph",
    "--decorate",
    "--no-decorate",
    "--all",
    "--abbrev-commit",
    "--pretty",
    "--format",
    "--date",
    "--since",
    "--until",
    "--after",
    "--before",
    "--author",
    "--committer",
    "--grep",
    "--reverse",
    "--max-count",
    "--skip",
    "--merges",
    "--no-merges",
    "--first-parent",
    "--follow",
    "--no-color",
    "--color",
    "--word-diff",
    "--cached",
    "--staged",
    "--short",
    "--branch",
    "--porcelain",
    "--untracked-files",
    "--ignored",
    "--ignore-space-change",
    "--ignore-all-space",
    "--minimal",
    "--diff-filter",
    "--summary",
    "--raw",
    "--no-patch",
    "--unified",
    "--relative",
    "--exit-code",
    "--quiet",
    "--check",
    "--no-renames",
    "--find-renames",
    "--verbose",
    "--remotes",
    "--list",
    "--show-current",
    "--contains",
    "--merged",
    "--no-merged",
    "--sort",
    "--tags",
    "--always",
    "--long",
    "--abbrev",
    "--dirty",
    "--show-toplevel",
    "--abbrev-ref",
    "--verify",
    "--is-inside-work-tree",
    "--show-prefix",
    "--show-cdup",
    "--symbolic-full-name",
    "--get",
    "--line-porcelain",
    "--root",
    "--modified",
    "--others",
    "--exclude-standard",
    "--deleted",
    "--stage",
    "--numbered",
    "--email",
    "--no-pager",
    "--ahead-behind",
    "--show-stash",
    "--topo-order",
    "--date-order",
    "--no-abbrev",
    "--full-history",
    "--simplify-merges",
    "--left-right",
    "--cherry-pick",
    "--boundary",
    "--count",
];

/// Single-letter flags git's read-only subcommands may carry (combined or alone).
const GIT_LETTERS: &[u8] = b"psbzarvlwtiquMnU0123456789";

/// The config keys `git config --get` may read.
fn safe_config_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    let parts: Vec<&str> = key.split('.').collect();
    matches!(
        key.as_str(),
        "user.name" | "user.email" | "core.autocrlf" | "init.defaultbranch" | "pull.rebase"
    ) || (parts.len() >= 3
        && ((parts[0] == "branch" && matches!(parts[parts.len() - 1], "remote" | "merge"))
            || (parts[0] == "remote" && matches!(parts[parts.len() - 1], "url" | "fetch"))))
}

fn check_git(
    context: &Context,
    base: &Base,
    args: &[&str],
    drivers: &mut Drivers,
) -> Result<Reads, String> {
    let mut args = args;
    while let Some(("--no-pager", rest)) = args.split_first().map(|(first, rest)| (*first, rest)) {
        args = rest;
    }
    let Some((subcommand, rest)) = args.split_first() else {
        return Err("git without a subcommand".to_owned());
    };
    if !GIT_READ_ONLY.contains(subcommand) {
        return Err(format!("git {subcommand} is not read-only"));
    }
    match *subcommand {
        "remote" if !matches!(rest, [] | ["-v"] | ["--verbose"]) => {
            return Err("only `git remote -v`".to_owned());
        }
        "stash" if rest != ["list"] => return Err("only `git stash list`".to_owned()),
        "config" => {
            return match rest {
                ["--get", key] if safe_config_key(key) => Ok(Vec::new()),
                _ => Err("git config only as `--get` of a safe key".to_owned()),
            };
        }
        _ => {}
    }
    let mut reads = Vec::new();
    let mut paths_only = false;
    for arg in rest {
        if arg.contains("%G") {
            return Err("a %G format runs gpg".to_owned());
        }
        if !paths_only && *arg == "--" {
            paths_only = true;
            continue;
        }
        if !paths_only && arg.starts_with('-') && arg.len() > 1 {
            check_git_flag(subcommand, arg)?;
            continue;
        }
        if matches!(*subcommand, "branch" | "tag")
            && !rest.iter().any(|flag| *flag == "--list" || *flag == "-l")
        {
            return Err(format!("git {subcommand} with an argument may create one"));
        }
        if arg.contains(':') {
            return Err(format!("{arg} reaches the whole repository"));
        }
        if Path::new(arg)
            .components()
            .any(|component| component == Component::ParentDir)
        {
            return Err(format!("a .. in {arg}"));
        }
        if arg.starts_with('/') || paths_only || base.absolute.join(arg).symlink_metadata().is_ok()
        {
            inside(context, base, arg)?;
            reads.push(("read", (*arg).to_owned()));
        }
    }
    drivers.merge(&git_probe(context, base)?);
    Ok(reads)
}

fn check_git_flag(subcommand: &str, arg: &str) -> Result<(), String> {
    let name = arg.split('=').next().unwrap_or(arg);
    let forbidden = [
        "--output",
        "--ext-diff",
        "--textconv",
        "--git-dir",
        "--work-tree",
        "--no-index",
        "--exec-path",
        "--contents",
        "--open-files-in-pager",
        "--orderfile",
        "--pathspec-from-file",
        "--ignore-revs-file",
        "--upload-pack",
        "--paginate",
    ];
    if forbidden.iter().any(|flag| name.starts_with(flag)) {
        return Err(format!("git option {name}"));
    }
    if name.starts_with("--") {
        return if GIT_FLAGS.contains(&name) {
            Ok(())
        } else {
            Err(format!("git option {name} is not on the read-only list"))
        };
    }
    let letters = &arg.as_bytes()[1..];
    // branch and tag create, delete, rename and sign with most letters.
    let allowed: &[u8] = match subcommand {
        "branch" => b"arvl",
        "tag" => b"ln0123456789",
        _ => GIT_LETTERS,
    };
    // `-n5`, `-U3`: a letter with its count attached.
    let counted =
        matches!(letters.first(), Some(b'n' | b'U')) && letters[1..].iter().all(u8::is_ascii_digit);
    if counted || letters.iter().all(|letter| allowed.contains(letter)) {
        Ok(())
    } else {
        Err(format!("git option {arg}"))
    }
}

/// Whether a repository configuration key names a program or moves git
/// (dax-wire.md 5.2); the reason when it does.
fn dangerous_git_key(key: &str, value: &str) -> Option<&'static str> {
    let key = key.to_ascii_lowercase();
    let parts: Vec<&str> = key.split('.').collect();
    let (section, last) = (parts[0], parts[parts.len() - 1]);
    let sub = parts.len() >= 3;
    let boolean = matches!(
        value.to_ascii_lowercase().as_str(),
        "" | "true" | "false" | "yes" | "no" | "on" | "off" | "1" | "0"
    );
    let names_program =
        (section == "filter" && sub && matches!(last, "clean" | "smudge" | "process"))
            || (section == "diff" && sub && matches!(last, "command" | "textconv"))
            || key == "diff.external"
            || matches!(
                key.as_str(),
                "core.askpass"
                    | "core.editor"
                    | "core.gitproxy"
                    | "core.attributesfile"
                    | "sequence.editor"
                    | "uploadpack.packobjectshook"
                    | "core.alternaterefscommand"
            )
            || (section == "remote"
                && sub
                && matches!(last, "uploadpack" | "receivepack" | "proxy" | "vcs"))
            || (section == "credential" && last == "helper")
            || (section == "merge" && sub && last == "driver")
            || (section == "pager" && !boolean)
            || (section == "hook" && sub && last == "command");
    if names_program {
        return Some("names a program");
    }
    if section == "protocol" && last == "allow" && value.eq_ignore_ascii_case("always") {
        return Some("allows any transport");
    }
    if key == "core.worktree" {
        return Some("moves the work tree");
    }
    if key == "core.bare" && value.eq_ignore_ascii_case("true") {
        return Some("makes the repository bare");
    }
    if section == "extensions" {
        return Some("is a repository extension");
    }
    if section == "submodule" && last == "update" && value.starts_with('!') {
        return Some("names a program");
    }
    None
}

/// The repository-config probe: `.git` must be a plain directory, and the
/// configuration of the repository and of every repository git can enter from
/// it must name no program. What they define that the overrides must reach
/// (drivers, `diff.external`, in any scope) is the answer.
fn git_probe(context: &Context, base: &Base) -> Result<Drivers, String> {
    let mut git_dir = None;
    let mut dir = Some(base.absolute.as_path());
    while let Some(current) = dir {
        let dot_git = current.join(".git");
        if let Ok(metadata) = dot_git.symlink_metadata() {
            if metadata.file_type().is_symlink() {
                return Err(format!(".git in {} is a symbolic link", current.display()));
            }
            if !metadata.is_dir() {
                return Err(format!(
                    ".git in {} is a file that points git at another directory",
                    current.display()
                ));
            }
            git_dir = Some(dot_git);
            break;
        }
        dir = current.parent();
    }
    let mut drivers = Drivers::default();
    if !probe_config(context, &base.absolute, "", &mut drivers)? {
        return match git_dir {
            Some(git_dir) => Err(format!(
                "the configuration of the repository at {} cannot be read",
                git_dir.display()
            )),
            None => Ok(drivers),
        };
    }
    if let Some(git_dir) = git_dir {
        probe_submodules(context, &git_dir)?;
        let mut entered = 0;
        probe_entered(context, &base.absolute, &mut drivers, &mut entered)?;
    }
    Ok(drivers)
}

/// Check the configuration git reads in `dir`: its own scopes (local,
/// worktree, includes) must name no program; every scope's drivers and
/// `diff.external` are added to `drivers` (the command scope is the
/// neutralisation's own). `false` when git answers nothing there (no
/// repository). `what` names the repository in a refusal.
fn probe_config(
    context: &Context,
    dir: &Path,
    what: &str,
    drivers: &mut Drivers,
) -> Result<bool, String> {
    let output = box_scrub::git_query(
        dir,
        &context.child_env,
        &["config", "--list", "-z", "--show-scope", "--show-origin"],
    )?;
    let Some(output) = output else {
        return Ok(false);
    };
    // Entries: scope NUL origin NUL key NEWLINE value NUL.
    let text = String::from_utf8_lossy(&output);
    let mut fields = text.split('\0');
    while let (Some(scope), Some(origin), Some(entry)) =
        (fields.next(), fields.next(), fields.next())
    {
        let (key, value) = entry.split_once('\n').unwrap_or((entry, ""));
        if scope == "command" {
            continue;
        }
        drivers.add_key(key);
        if matches!(scope, "system" | "global") {
            continue;
        }
        if let Some(why) = dangerous_git_key(key, value) {
            return Err(format!("{key} {why} (set in {origin}{what})"));
        }
    }
    Ok(true)
}

/// The most repositories git may enter from one stage before the stage asks
/// instead.
const MAX_ENTERED_REPOSITORIES: usize = 200;

/// Every populated submodule or embedded repository the index of the
/// repository holding `dir` names (a gitlink whose directory has a `.git`),
/// recursively: `git status` and `git diff` run git inside each with its own
/// configuration (a clean filter there runs on a changed file). Each is
/// probed as the repository itself is.
fn probe_entered(
    context: &Context,
    dir: &Path,
    drivers: &mut Drivers,
    entered: &mut usize,
) -> Result<(), String> {
    let Some(top) =
        box_scrub::git_query(dir, &context.child_env, &["rev-parse", "--show-toplevel"])?
    else {
        return Err(format!(
            "where the repository holding {} begins cannot be read",
            dir.display()
        ));
    };
    let top = PathBuf::from(
        String::from_utf8_lossy(&top)
            .trim_end_matches('\n')
            .to_owned(),
    );
    let Some(index) = box_scrub::git_query(&top, &context.child_env, &["ls-files", "-s", "-z"])?
    else {
        return Err(format!(
            "the index of the repository at {} cannot be read",
            top.display()
        ));
    };
    // Entries: MODE SP OBJECT SP STAGE TAB PATH NUL.
    for entry in index.split(|byte| *byte == 0) {
        let Some(path) = entry.strip_prefix(b"160000 ") else {
            continue;
        };
        let Some(tab) = path.iter().position(|byte| *byte == b'\t') else {
            continue;
        };
        let path = std::ffi::OsStr::from_bytes(&path[tab + 1..]);
        let repository = top.join(path);
        if repository.join(".git").symlink_metadata().is_err() {
            continue;
        }
        *entered += 1;
        if *entered > MAX_ENTERED_REPOSITORIES {
            return Err(format!(
                "more than {MAX_ENTERED_REPOSITORIES} submodules or embedded repositories under {}",
                top.display()
            ));
        }
        let what = format!(
            ", in {}, which git enters from {}",
            repository.display(),
            top.display()
        );
        if !probe_config(context, &repository, &what, drivers)? {
            return Err(format!(
                "the configuration of {}, which git enters from {}, cannot be read",
                repository.display(),
                top.display()
            ));
        }
        probe_entered(context, &repository, drivers, entered)?;
    }
    Ok(())
}

/// The most submodule configurations the probe reads before it asks instead.
const MAX_SUBMODULE_CONFIGS: usize = 200;

/// Every `config` under `<gitdir>/modules`, checked strictly: git runs inside
/// a submodule with that configuration, and the driver overrides only name
/// the superproject's drivers. `core.bare`/`core.worktree` are allowed there
/// because git writes them for submodules.
fn probe_submodules(context: &Context, git_dir: &Path) -> Result<(), String> {
    let mut pending = vec![git_dir.join("modules")];
    let mut configs = Vec::new();
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(file_type) = entry.file_type() else {
                continue;
            };
            if file_type.is_dir() {
                pending.push(entry.path());
            } else if entry.file_name() == "config" {
                configs.push(entry.path());
                if configs.len() > MAX_SUBMODULE_CONFIGS {
                    return Err(format!(
                        "more than {MAX_SUBMODULE_CONFIGS} submodule configurations under {}",
                        git_dir.display()
                    ));
                }
            }
        }
    }
    for config in configs {
        let file = config.to_string_lossy();
        let output = box_scrub::git_query(
            git_dir,
            &context.child_env,
            &["config", "--file", &file, "--list", "-z"],
        )?
        .ok_or_else(|| format!("{file} cannot be read"))?;
        let text = String::from_utf8_lossy(&output);
        for entry in text.split('\0').filter(|entry| !entry.is_empty()) {
            let (key, value) = entry.split_once('\n').unwrap_or((entry, ""));
            let lower = key.to_ascii_lowercase();
            if matches!(lower.as_str(), "core.bare" | "core.worktree") {
                continue;
            }
            let why = dangerous_git_key(key, value).or_else(|| strict_git_key(&lower, value));
            if let Some(why) = why {
                return Err(format!("{key} {why} (set in {file})"));
            }
        }
    }
    Ok(())
}

/// The keys strict mode adds: those the neutralisation covers, for
/// configuration it may not reach.
fn strict_git_key(key: &str, value: &str) -> Option<&'static str> {
    let boolean = matches!(
        value.to_ascii_lowercase().as_str(),
        "" | "true" | "false" | "yes" | "no" | "on" | "off" | "1" | "0"
    );
    let program = (key == "core.fsmonitor" && !boolean)
        || key == "gpg.program"
        || (key.starts_with("gpg.") && key.ends_with(".program") && !boolean)
        || matches!(key, "core.hookspath" | "core.sshcommand" | "core.pager");
    program.then_some("names a program")
}

// ---------------------------------------------------------------------------
// The splitter.

/// A redirect the splitter found.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Redirect {
    /// `write` or `read`.
    tool: &'static str,
    /// The target as written.
    raw: String,
    /// The target after quote removal.
    value: String,
}

/// What the splitter cut a line into.
#[derive(Debug, Default, PartialEq, Eq)]
struct Split {
    parts: Vec<String>,
    redirects: Vec<Redirect>,
}

/// The end of a quoted run starting at `at` (the opening quote), past the
/// closing one.
fn skip_quote(bytes: &[u8], at: usize, close: u8, escapes: bool) -> Result<usize, String> {
    let mut index = at + 1;
    while index < bytes.len() {
        if escapes && bytes[index] == b'\\' {
            index += 2;
            continue;
        }
        if bytes[index] == close {
            return Ok(index + 1);
        }
        index += 1;
    }
    Err("unterminated quote".to_owned())
}

/// Characters that end an unquoted word for the splitter.
fn ends_word(byte: u8) -> bool {
    matches!(
        byte,
        b' ' | b'\t' | b'\n' | b';' | b'|' | b'&' | b'<' | b'>' | b'(' | b')'
    )
}

/// A word from `at`: its end, as written, and with quotes removed.
fn split_word(line: &str, at: usize) -> Result<(usize, String, String), String> {
    let bytes = line.as_bytes();
    let mut index = at;
    let mut value = String::new();
    while index < bytes.len() && !ends_word(bytes[index]) {
        match bytes[index] {
            b'\'' => {
                let end = skip_quote(bytes, index, b'\'', false)?;
                value.push_str(&line[index + 1..end - 1]);
                index = end;
            }
            b'"' => {
                let end = skip_quote(bytes, index, b'"', true)?;
                value.push_str(&line[index + 1..end - 1]);
                index = end;
            }
            b'$' if bytes.get(index + 1) == Some(&b'\'') => {
                let end = skip_quote(bytes, index + 1, b'\'', true)?;
                value.push_str(&line[index..end]);
                index = end;
            }
            b'\\' => {
                let next = line[index + 1..].chars().next().map_or(0, char::len_utf8);
                let end = index + 1 + next;
                value.push_str(&line[index..end]);
                index = end;
            }
            _ => {
                let end = index + line[index..].chars().next().map_or(1, char::len_utf8);
                value.push_str(&line[index..end]);
                index = end;
            }
        }
    }
    Ok((index, line[at..index].to_owned(), value))
}

/// Cut a line at its operators, following quotes and comments.
fn split(line: &str) -> Result<Split, String> {
    let bytes = line.as_bytes();
    let mut split = Split::default();
    let mut part = String::new();
    let mut index = 0;
    let mut word_start = true;
    let cut = |part: &mut String, split: &mut Split| {
        let text = strip_keywords(part.trim());
        if !text.is_empty() {
            split.parts.push(text.to_owned());
        }
        part.clear();
    };
    while index < bytes.len() {
        let byte = bytes[index];
        match byte {
            b';' | b'\n' => {
                cut(&mut part, &mut split);
                index += 1;
                word_start = true;
            }
            b'|' => {
                cut(&mut part, &mut split);
                index += if matches!(bytes.get(index + 1), Some(b'|' | b'&')) {
                    2
                } else {
                    1
                };
                word_start = true;
            }
            b'&' if bytes.get(index + 1) == Some(&b'>') => {
                let append = bytes.get(index + 2) == Some(&b'>');
                let op_end = index + if append { 3 } else { 2 };
                index = redirect_target(line, op_end, "write", &mut part, &mut split)?;
                word_start = true;
            }
            b'&' => {
                cut(&mut part, &mut split);
                index += if bytes.get(index + 1) == Some(&b'&') {
                    2
                } else {
                    1
                };
                word_start = true;
            }
            b'>' | b'<' => {
                index = split_redirect(line, index, &mut part, &mut split)?;
                word_start = true;
            }
            b'#' if word_start => {
                while index < bytes.len() && bytes[index] != b'\n' {
                    index += 1;
                }
            }
            b' ' | b'\t' | b'(' | b')' => {
                part.push(byte as char);
                index += 1;
                word_start = true;
            }
            _ => {
                let (end, raw, _) = split_word(line, index)?;
                part.push_str(&raw);
                index = end;
                word_start = false;
            }
        }
    }
    cut(&mut part, &mut split);
    Ok(split)
}

/// A part without the grouping and reserved words that lead it (`(`, `{`,
/// `!`, `if`, `then`, `do`...), so a rule for the command it runs reaches it:
/// `if true; then touch x; fi` has the part `touch x`, not `then touch x`.
fn strip_keywords(mut part: &str) -> &str {
    const LEADERS: &[&str] = &[
        "if", "then", "else", "elif", "do", "while", "until", "time", "exec", "command", "builtin",
        "nohup",
    ];
    loop {
        let trimmed = part.trim_start_matches(['(', '{', '!', ' ', '\t']);
        let word_end = trimmed.find([' ', '\t']).unwrap_or(trimmed.len());
        let word = &trimmed[..word_end];
        if word_end < trimmed.len() && LEADERS.contains(&word) {
            part = &trimmed[word_end..];
        } else {
            return trimmed.trim();
        }
    }
}

/// A `>`/`<` operator at `at` and its target.
fn split_redirect(
    line: &str,
    at: usize,
    part: &mut String,
    split: &mut Split,
) -> Result<usize, String> {
    let rest = &line[at..];
    // Heredocs, here-strings and process substitution name no file.
    for op in ["<<<", "<<-", "<<", "<(", ">("] {
        if rest.starts_with(op) {
            part.push_str(op);
            return Ok(at + op.len());
        }
    }
    let (op, tool) = [
        (">>", "write"),
        (">|", "write"),
        (">&", "write"),
        ("<>", "write"),
        ("<&", "read"),
        (">", "write"),
        ("<", "read"),
    ]
    .into_iter()
    .find(|(op, _)| rest.starts_with(op))
    .unwrap_or((">", "write"));
    let next = at + op.len();
    if op.ends_with('&') {
        // `>&2`, `>&-`, `2>&1-`: a descriptor; anything else opens a file.
        let (end, _, value) = target_word(line, next)?;
        let descriptor = value.trim_end_matches('-');
        if !value.is_empty() && descriptor.bytes().all(|byte| byte.is_ascii_digit()) {
            part.push(' ');
            return Ok(end);
        }
    }
    redirect_target(line, next, tool, part, split)
}

/// The word after optional blanks at `at`.
fn target_word(line: &str, at: usize) -> Result<(usize, String, String), String> {
    let bytes = line.as_bytes();
    let mut index = at;
    while index < bytes.len() && matches!(bytes[index], b' ' | b'\t') {
        index += 1;
    }
    split_word(line, index)
}

fn redirect_target(
    line: &str,
    at: usize,
    tool: &'static str,
    part: &mut String,
    split: &mut Split,
) -> Result<usize, String> {
    let (end, raw, value) = target_word(line, at)?;
    // The part shows the command without its redirects, as a rule would see it.
    part.push(' ');
    if !raw.is_empty() {
        split.redirects.push(Redirect { tool, raw, value });
    }
    Ok(end)
}

/// A part that is a plain `cd DIR`: DIR.
fn plain_cd(part: &str) -> Option<&str> {
    let dir = part.strip_prefix("cd ")?.trim();
    (!dir.is_empty() && dir.bytes().all(is_word_char)).then_some(dir)
}

/// Join `dir` onto the root-relative `base`, cleaned; `None` when it leaves the root.
fn join_relative(context: &Context, base: &str, dir: &str) -> Option<String> {
    let root = context.workspace.root();
    let start = if Path::new(dir).is_absolute() {
        PathBuf::from(dir)
    } else {
        root.join(base).join(dir)
    };
    let mut clean = PathBuf::new();
    for component in start.components() {
        match component {
            Component::ParentDir => {
                clean.pop();
            }
            Component::CurDir => {}
            other => clean.push(other),
        }
    }
    clean
        .strip_prefix(root)
        .ok()
        .map(|path| path.to_string_lossy().into_owned())
}

fn analyse_split(context: &Context, line: &str) -> Result<Analysis, String> {
    let split = split(line)?;
    if split.parts.is_empty() && split.redirects.is_empty() {
        return Ok(Analysis {
            calls: Vec::new(),
            signed: None,
            run: None,
            drivers: Drivers::default(),
        });
    }
    let mut calls: Vec<FactCall> = split
        .parts
        .iter()
        .map(|part| FactCall {
            tool: String::new(),
            args: command_args(part.clone()),
            text: part.clone(),
        })
        .collect();
    let mut bases = vec![String::new()];
    for part in &split.parts {
        if let Some(dir) = plain_cd(part)
            && let Some(next) = bases
                .last()
                .and_then(|last| join_relative(context, last, dir))
            && !bases.contains(&next)
        {
            bases.push(next);
        }
    }
    let mut stampable = true;
    let mut signed = String::new();
    for redirect in &split.redirects {
        if redirect.value == "/dev/null" {
            continue;
        }
        if redirect.value.contains(['$', '`', '*', '?', '\\']) || redirect.raw.starts_with('~') {
            stampable = false;
            let mut args = Map::new();
            args.insert(
                "path".to_owned(),
                Value::String(format!("{SENTINEL}{}", redirect.raw)),
            );
            calls.push(FactCall {
                tool: redirect.tool.to_owned(),
                args,
                text: redirect.raw.clone(),
            });
            continue;
        }
        for base in &bases {
            for call in context
                .workspace
                .word_facts(base, &redirect.value, redirect.tool)
            {
                if !calls.contains(&call) {
                    calls.push(call);
                }
            }
            let target = if Path::new(&redirect.value).is_absolute() {
                PathBuf::from(&redirect.value)
            } else {
                context.workspace.root().join(base).join(&redirect.value)
            };
            signed.push_str(&format!(
                "{}\0{}\0{}\0",
                redirect.tool,
                base,
                resolved_parent(&target).display()
            ));
        }
    }
    calls.push(sentinel_call(line, ""));
    let has_files = split
        .redirects
        .iter()
        .any(|redirect| redirect.value != "/dev/null");
    // The line runs as typed: which repository its git enters cannot be said.
    let mut drivers = Drivers::default();
    if stampable && has_files && !names_git(line) {
        // Anything else the line runs is the code the person approved; its
        // git is neutralised for the repositories the analysis can see.
        for base in &bases {
            match box_scrub::configured_drivers(
                &context.workspace.root().join(base),
                &context.child_env,
            ) {
                Ok(found) => drivers.merge(&found),
                Err(_) => stampable = false,
            }
        }
    } else {
        stampable = false;
    }
    let signed = (stampable && has_files).then(|| {
        let mut text = format!("line\0{line}\0");
        for call in &calls {
            text.push_str(&call.tool);
            text.push('\0');
            text.push_str(&Value::Object(call.args.clone()).to_string());
            text.push('\0');
        }
        text + &signed
    });
    let run = signed.as_ref().map(|_| line.to_owned());
    Ok(Analysis {
        calls,
        signed,
        run,
        drivers,
    })
}

/// Whether a line names git, in any case and even inside a word, once the
/// quotes and backslashes bash would remove are taken out (`g''it`, `\git`).
fn names_git(line: &str) -> bool {
    let plain: String = line
        .chars()
        .filter(|c| !matches!(c, '\'' | '"' | '\\'))
        .collect();
    plain.to_ascii_lowercase().contains("git")
}

/// A target with its directory's links resolved, and its own link if it is one.
fn resolved_parent(path: &Path) -> PathBuf {
    if let Ok(real) = path.canonicalize() {
        return real;
    }
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => resolved_parent(parent).join(name),
        _ => path.to_path_buf(),
    }
}

#[cfg(test)]
#[path = "analysis_tests.rs"]
mod tests;
