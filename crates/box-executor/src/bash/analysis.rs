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
//!
//! The parts: `lexer` (the subset's tokens and stages), `subset` (its
//! read-only checks, claims and plan), `paths` (where a stage runs, paths
//! kept inside), `glob` (glob expansion), `git` (git stages and the
//! repository-config probe), `split` (the splitter).

mod git;
mod glob;
mod lexer;
mod paths;
mod split;
mod subset;

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
    if let Some(tokens) = lexer::lex(command) {
        return Ok(subset::analyse_subset(context, command, &tokens));
    }
    split::analyse_split(context, command)
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

#[cfg(test)]
mod tests;
