//! Profile errors: every problem names the file, the line and column, the
//! field, what was given and what would be accepted. A load reports every
//! problem it found, not only the first.

use std::fmt;
use std::sync::Arc;

/// Where in which file a value was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    /// The file (a path, or `shipped:NAME.toml` for a profile built into box).
    pub file: Arc<str>,
    /// 1-based line.
    pub line: u32,
    /// 1-based column, in characters.
    pub column: u32,
}

impl Position {
    /// A position that names only the file (for problems with no better place).
    pub fn file(file: &Arc<str>) -> Self {
        Self {
            file: file.clone(),
            line: 0,
            column: 0,
        }
    }
}

impl fmt::Display for Position {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(formatter, "{}", self.file)
        } else {
            write!(formatter, "{}:{}:{}", self.file, self.line, self.column)
        }
    }
}

/// One thing wrong with a profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Where.
    pub at: Position,
    /// The field path (`limits.memory`, `server[fetch].image`); empty for the whole file.
    pub field: String,
    /// What is wrong and what would be accepted.
    pub message: String,
}

impl Problem {
    pub(crate) fn new(at: Position, field: &str, message: &str) -> Self {
        Self {
            at,
            field: field.to_owned(),
            message: message.to_owned(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.at.file.is_empty() {
            write!(formatter, "{}", self.message)
        } else if self.field.is_empty() {
            write!(formatter, "{}: {}", self.at, self.message)
        } else {
            write!(formatter, "{}: {}: {}", self.at, self.field, self.message)
        }
    }
}

/// Why a profile could not be loaded: every problem found, each naming the
/// file, line, column and field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ProfileError {
    /// The problems, in file order (never empty).
    pub problems: Vec<Problem>,
}

impl ProfileError {
    pub(crate) fn one(problem: Problem) -> Self {
        Self {
            problems: vec![problem],
        }
    }

    /// A problem that has no file (a name nobody defines, an unreadable directory).
    pub fn plain(message: &str) -> Self {
        Self::one(Problem::new(Position::file(&Arc::from("")), "", message))
    }
}

impl fmt::Display for ProfileError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, problem) in self.problems.iter().enumerate() {
            if index > 0 {
                writeln!(formatter)?;
            }
            write!(formatter, "{problem}")?;
        }
        Ok(())
    }
}
