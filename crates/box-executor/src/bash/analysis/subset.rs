//! The safe subset's analysis: each stage of a lexed line checked against
//! the read-only list (flags, paths inside the workspace, no `..`), the files
//! it reads claimed, and the plan rendered for a stamp.

use serde_json::Value;

use super::git::check_git;
use super::glob::expand_glob;
use super::lexer::{Stage, Token, structure};
use super::paths::{Base, Reads, inside, lexical, resolved};
use super::{Analysis, command_args, sentinel_call};
use crate::Context;
use crate::facts::{FactCall, SENTINEL};
use box_scrub::Drivers;

pub(super) fn analyse_subset(context: &Context, line: &str, tokens: &[Token]) -> Analysis {
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

#[cfg(test)]
mod tests;
