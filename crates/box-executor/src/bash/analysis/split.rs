//! The splitter: a line outside the safe subset cut at its operators into
//! parts, with the files its redirects lead to, the whole line claimed with
//! the sentinel prefix.

use std::path::{Component, Path, PathBuf};

use serde_json::{Map, Value};

use super::lexer::is_word_char;
use super::{Analysis, command_args, sentinel_call};
use crate::Context;
use crate::facts::{FactCall, SENTINEL};
use box_scrub::Drivers;

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
pub(super) struct Split {
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
pub(super) fn split(line: &str) -> Result<Split, String> {
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

pub(super) fn analyse_split(context: &Context, line: &str) -> Result<Analysis, String> {
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
mod tests;
