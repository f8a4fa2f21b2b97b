//! A profile file as a tree of located values: every key and value knows the
//! file, line and column it came from, so a merged (`extends`) tree still points
//! each error at the file that wrote the value.

use std::sync::Arc;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

use super::error::{Position, Problem};

/// One value and where it was written.
#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub(crate) value: Value,
    pub(crate) at: Position,
}

/// A TOML value, owned.
#[derive(Debug, Clone)]
pub(crate) enum Value {
    String(String),
    /// Integers keep their text so an out-of-range one is reported as written.
    Integer(String),
    Float(f64),
    Boolean(bool),
    Datetime(String),
    Array(Vec<Node>),
    Table(Vec<(Key, Node)>),
}

/// A table key and where it was written.
#[derive(Debug, Clone)]
pub(crate) struct Key {
    pub(crate) name: String,
    pub(crate) at: Position,
}

impl Value {
    /// What a user would call this value's type, for "got ..." in errors.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Value::String(_) => "a string",
            Value::Integer(_) => "an integer",
            Value::Float(_) => "a float",
            Value::Boolean(_) => "a boolean",
            Value::Datetime(_) => "a date-time",
            Value::Array(_) => "an array",
            Value::Table(_) => "a table",
        }
    }

    /// A short rendering of the value as written, for "got ..." in errors.
    pub(crate) fn shown(&self) -> String {
        match self {
            Value::String(text) => format!("{text:?}"),
            Value::Integer(text) | Value::Datetime(text) => text.clone(),
            Value::Float(number) => format!("{number}"),
            Value::Boolean(flag) => flag.to_string(),
            Value::Array(_) => "an array".to_owned(),
            Value::Table(_) => "a table".to_owned(),
        }
    }
}

impl Node {
    /// The entry `name` of a table node.
    pub(crate) fn get(&self, name: &str) -> Option<&Node> {
        match &self.value {
            Value::Table(entries) => entries
                .iter()
                .find(|(key, _)| key.name == name)
                .map(|(_, node)| node),
            _ => None,
        }
    }
}

/// Parse `text` (the contents of `file`) into a located tree.
///
/// Refuses what TOML itself accepts but a profile should not: an empty file
/// and a leading byte-order mark.
pub(crate) fn parse(file: &Arc<str>, text: &str) -> Result<Node, Problem> {
    let start = Position {
        file: file.clone(),
        line: 1,
        column: 1,
    };
    if text.starts_with('\u{feff}') {
        return Err(Problem::new(
            start,
            "",
            "the file starts with a byte-order mark (BOM); save it as UTF-8 without one",
        ));
    }
    if text.trim().is_empty() {
        return Err(Problem::new(
            start,
            "",
            "the file is empty; a profile needs at least `description = \"...\"`",
        ));
    }
    let lines = LineIndex::new(text);
    match DeTable::parse(text) {
        Ok(table) => Ok(convert_table(&lines, file, table)),
        Err(error) => {
            let offset = error.span().map_or(0, |span| span.start);
            let message = error.message().trim().to_owned();
            Err(Problem::new(
                lines.position(file, offset),
                "",
                &format!("not valid TOML: {message}"),
            ))
        }
    }
}

fn convert_table(lines: &LineIndex, file: &Arc<str>, table: Spanned<DeTable<'_>>) -> Node {
    let at = lines.position(file, table.span().start);
    let entries = table
        .into_inner()
        .into_iter()
        .map(|(key, value)| {
            let key = Key {
                at: lines.position(file, key.span().start),
                name: key.into_inner().into_owned(),
            };
            (key, convert(lines, file, value))
        })
        .collect();
    Node {
        value: Value::Table(entries),
        at,
    }
}

fn convert(lines: &LineIndex, file: &Arc<str>, value: Spanned<DeValue<'_>>) -> Node {
    let at = lines.position(file, value.span().start);
    let span = value.span();
    let value = match value.into_inner() {
        DeValue::String(text) => Value::String(text.into_owned()),
        DeValue::Integer(integer) => {
            Value::Integer(integer_text(integer.as_str(), integer.radix()))
        }
        DeValue::Float(float) => {
            Value::Float(float.as_str().replace('_', "").parse().unwrap_or(f64::NAN))
        }
        DeValue::Boolean(flag) => Value::Boolean(flag),
        DeValue::Datetime(datetime) => Value::Datetime(datetime.to_string()),
        DeValue::Array(array) => Value::Array(
            array
                .into_iter()
                .map(|item| convert(lines, file, item))
                .collect(),
        ),
        DeValue::Table(table) => {
            return convert_table(lines, file, Spanned::new(span, table));
        }
    };
    Node { value, at }
}

/// A TOML integer as decimal text (underscores dropped, other radices converted).
fn integer_text(text: &str, radix: u32) -> String {
    let digits = text.replace('_', "");
    if radix == 10 {
        return digits;
    }
    match i128::from_str_radix(&digits, radix) {
        Ok(number) => number.to_string(),
        Err(_) => digits,
    }
}

/// Byte offset to line and column.
struct LineIndex<'a> {
    text: &'a str,
    starts: Vec<usize>,
}

impl<'a> LineIndex<'a> {
    fn new(text: &'a str) -> Self {
        let starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(index, _)| index + 1))
            .collect();
        Self { text, starts }
    }

    fn position(&self, file: &Arc<str>, offset: usize) -> Position {
        let line = self.starts.partition_point(|start| *start <= offset).max(1);
        let start = self.starts[line - 1];
        let column = self
            .text
            .get(start..offset.min(self.text.len()))
            .map_or(1, |prefix| prefix.chars().count() + 1);
        Position {
            file: file.clone(),
            line: u32::try_from(line).unwrap_or(u32::MAX),
            column: u32::try_from(column).unwrap_or(u32::MAX),
        }
    }
}
