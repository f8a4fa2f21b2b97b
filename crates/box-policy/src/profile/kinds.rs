//! A profile field's value, by its type: how it is read from a profile (the
//! error naming the field), written back in the profile's words (`box profile
//! show`) and given in a plan (`box profile resolve --json`). A row of a table
//! in `fields.rs` names its type and, when its reading is special (a danger,
//! a check beyond the type), the [`Reads`] that reads it; every other field
//! is read, shown and planned by its type alone.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value as Json, json};

use super::model::{ForkMode, OnPersisted};
use super::tree::Node;
use super::validate::Walk;
use super::value::{ByteSize, show_duration};
use crate::image::PullPolicy;
use crate::plan::{LocalUserland, MountMode, NetworkMode, Requirement, TmpMode, VolumeScope};

/// A field's type.
pub(crate) trait Kind: Sized + PartialEq {
    /// Whether `box profile show` writes it as a list (`[a, b]`).
    const LIST: bool = false;

    /// Read it from `node`, a problem naming `field` when it is not one.
    fn read(walk: &mut Walk, node: &Node, field: &str) -> Option<Self>;

    /// As `box profile show` writes it (a list without its brackets).
    fn text(&self) -> String;

    /// In the profile's words, as `box profile show --json` writes it: its
    /// text, unless it is a number, a flag or a list.
    fn word(&self) -> Json {
        json!(self.text())
    }

    /// As a plan's JSON gives it (`box profile resolve --json`, the envelope).
    fn plan(&self) -> Json {
        self.word()
    }
}

/// `"a", "b" or "c"`: the words an error says to write.
pub(crate) fn one_of(choices: &[&str]) -> String {
    let quoted: Vec<String> = choices
        .iter()
        .map(|choice| format!("\"{choice}\""))
        .collect();
    match quoted.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// A choice among words: an enum whose every value has its word (`as_str`),
/// the same in a profile and a tightening.
pub(crate) trait Choice: Copy + PartialEq + 'static {
    /// Every value, in the order errors list them.
    const ALL: &'static [Self];

    /// Its word.
    fn name(self) -> &'static str;

    /// The value written `word`; else what to write instead (`"a" or "b"`).
    fn from_word(word: &str) -> Result<Self, String> {
        Self::ALL
            .iter()
            .copied()
            .find(|value| value.name() == word)
            .ok_or_else(|| {
                let words: Vec<&str> = Self::ALL.iter().map(|value| value.name()).collect();
                format!("{word:?} is not accepted; write {}", one_of(&words))
            })
    }
}

impl<T: Choice> Kind for T {
    fn read(walk: &mut Walk, node: &Node, field: &str) -> Option<Self> {
        let choices: Vec<(&str, T)> = T::ALL.iter().map(|value| (value.name(), *value)).collect();
        walk.choice(node, field, &choices)
    }

    fn text(&self) -> String {
        self.name().to_owned()
    }
}

/// `impl Choice for Type { [values in the order errors list them] }`, each
/// value's word its `as_str`.
macro_rules! choices {
    ($($ty:ty: [$($value:expr),+ $(,)?];)*) => {$(
        impl Choice for $ty {
            const ALL: &'static [Self] = &[$($value),+];

            fn name(self) -> &'static str {
                self.as_str()
            }
        }
    )*};
}

choices! {
    Requirement: [Requirement::Required, Requirement::BestEffort, Requirement::Off];
    TmpMode: [TmpMode::Exec, TmpMode::NoExec];
    PullPolicy: [PullPolicy::Never, PullPolicy::Missing, PullPolicy::Always];
    MountMode: [MountMode::ReadWrite, MountMode::ReadOnly];
    LocalUserland: [LocalUserland::Refuse, LocalUserland::Host];
    OnPersisted: [OnPersisted::Report, OnPersisted::Refuse, OnPersisted::Hide];
    ForkMode: [ForkMode::Auto, ForkMode::Worktree, ForkMode::Copy];
    NetworkMode: [NetworkMode::None, NetworkMode::Egress, NetworkMode::Bridge];
    VolumeScope: [VolumeScope::Session, VolumeScope::Profile];
}

impl Kind for bool {
    fn read(walk: &mut Walk, node: &Node, field: &str) -> Option<Self> {
        walk.boolean(node, field)
    }

    fn word(&self) -> Json {
        json!(self)
    }

    fn text(&self) -> String {
        self.to_string()
    }
}

impl Kind for String {
    fn read(walk: &mut Walk, node: &Node, field: &str) -> Option<Self> {
        walk.string(node, field)
    }

    fn text(&self) -> String {
        self.clone()
    }
}

impl Kind for Vec<String> {
    const LIST: bool = true;

    fn read(walk: &mut Walk, node: &Node, field: &str) -> Option<Self> {
        let entries = walk.strings(node, field, |text| Ok(text.to_owned()))?;
        Some(entries.into_iter().map(|(text, _)| text).collect())
    }

    fn word(&self) -> Json {
        json!(self)
    }

    fn text(&self) -> String {
        self.join(", ")
    }
}

impl Kind for Vec<PathBuf> {
    const LIST: bool = true;

    fn read(walk: &mut Walk, node: &Node, field: &str) -> Option<Self> {
        let entries = walk.strings(node, field, |text| Ok(text.to_owned()))?;
        Some(
            entries
                .into_iter()
                .map(|(text, _)| PathBuf::from(text))
                .collect(),
        )
    }

    fn word(&self) -> Json {
        json!(
            self.iter()
                .map(|path| path.display().to_string())
                .collect::<Vec<_>>()
        )
    }

    fn text(&self) -> String {
        let shown: Vec<String> = self.iter().map(|path| path.display().to_string()).collect();
        shown.join(", ")
    }
}

impl Kind for PathBuf {
    fn read(walk: &mut Walk, node: &Node, field: &str) -> Option<Self> {
        walk.string(node, field).map(PathBuf::from)
    }

    fn text(&self) -> String {
        self.display().to_string()
    }
}

/// A field that may be unset (`None`: written `none`, `null` in JSON).
impl<T: Kind> Kind for Option<T> {
    fn read(walk: &mut Walk, node: &Node, field: &str) -> Option<Self> {
        T::read(walk, node, field).map(Some)
    }

    fn word(&self) -> Json {
        self.as_ref().map_or(Json::Null, Kind::word)
    }

    fn text(&self) -> String {
        self.as_ref().map_or_else(|| "none".to_owned(), Kind::text)
    }

    fn plan(&self) -> Json {
        self.as_ref().map_or(Json::Null, Kind::plan)
    }
}

impl Kind for Duration {
    fn read(walk: &mut Walk, node: &Node, field: &str) -> Option<Self> {
        walk.duration(node, field)
    }

    fn text(&self) -> String {
        show_duration(*self)
    }

    /// In milliseconds.
    fn plan(&self) -> Json {
        json!(u64::try_from(self.as_millis()).unwrap_or(u64::MAX))
    }
}

impl Kind for ByteSize {
    fn read(walk: &mut Walk, node: &Node, field: &str) -> Option<Self> {
        walk.size(node, field)
    }

    fn text(&self) -> String {
        self.to_string()
    }

    /// In bytes.
    fn plan(&self) -> Json {
        json!(self.0)
    }
}

impl Kind for u64 {
    fn read(walk: &mut Walk, node: &Node, field: &str) -> Option<Self> {
        walk.count(node, field)
    }

    fn word(&self) -> Json {
        json!(self)
    }

    fn text(&self) -> String {
        self.to_string()
    }
}

impl Kind for usize {
    fn read(walk: &mut Walk, node: &Node, field: &str) -> Option<Self> {
        walk.count(node, field)
            .map(|count| usize::try_from(count).unwrap_or(usize::MAX))
    }

    fn word(&self) -> Json {
        json!(self)
    }

    fn text(&self) -> String {
        self.to_string()
    }
}

/// How one field is read and written back: by its type ([`Plain`]), or by
/// a reader of its own where its reading is special. `C` is what its table
/// is read within (a table declared `with` a context: the fields of a
/// `[[server]]` read before it, the profile's limits), which only a reader
/// whose reading depends on other fields looks at (`read_in`, `absent`).
pub(crate) trait Reads<T: Kind, C = ()> {
    /// Read it (by its type).
    fn read(walk: &mut Walk, node: &Node, field: &str) -> Option<T> {
        T::read(walk, node, field)
    }

    /// Read it within its table's context (by `read`, unless it depends on
    /// other fields).
    fn read_in(walk: &mut Walk, node: &Node, field: &str, _context: &C) -> Option<T> {
        Self::read(walk, node, field)
    }

    /// Its value when its table does not write it, where that depends on the
    /// context (a server's limits: the profile's); `None`: its row's default.
    fn absent(_context: &C) -> Option<T> {
        None
    }

    /// In the profile's words (by its type).
    fn word(value: &T) -> Json {
        value.word()
    }

    /// As `box profile show` writes it (by its type).
    fn text(value: &T) -> String {
        value.text()
    }
}

/// A reader of a field that depends on fields read before it in its table
/// (named in its row, `Servers[limits]`): it is given them as read (`None`:
/// not read), whether its own field is written (`node`) or not.
pub(crate) trait After<T, Earlier> {
    /// Read it (or judge its absence) after `earlier`.
    fn read_after(walk: &mut Walk, node: Option<&Node>, field: &str, earlier: Earlier)
    -> Option<T>;
}

/// A field read and written by its type alone.
pub(crate) struct Plain;

impl<T: Kind, C> Reads<T, C> for Plain {}

/// A reader of a field written as one of a few words, each meaning a value
/// of its type: `words!(Git: bool = ["neutralise" = true, "off" = false]);`.
macro_rules! words {
    ($(#[doc = $doc:literal])* $name:ident: $ty:ty = [$($word:literal = $value:expr),+ $(,)?]) => {
        $(#[doc = $doc])*
        pub(crate) struct $name;

        impl $name {
            const WORDS: &'static [(&'static str, $ty)] = &[$(($word, $value)),+];

            fn word_of(value: &$ty) -> &'static str {
                Self::WORDS
                    .iter()
                    .find(|(_, candidate)| candidate == value)
                    .map_or("", |(word, _)| word)
            }
        }

        impl<C> $crate::profile::kinds::Reads<$ty, C> for $name {
            fn read(
                walk: &mut $crate::profile::validate::Walk,
                node: &$crate::profile::tree::Node,
                field: &str,
            ) -> Option<$ty> {
                walk.choice(node, field, Self::WORDS)
            }

            fn word(value: &$ty) -> serde_json::Value {
                serde_json::json!(Self::word_of(value))
            }

            fn text(value: &$ty) -> String {
                Self::word_of(value).to_owned()
            }
        }
    };
}
pub(crate) use words;

/// How `box profile show` places a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Show {
    /// On its table's line: `name value`.
    Line,
    /// On a line of its own, `DANGEROUS`, when it is not its default: what
    /// only an operator's `allow_dangerous` lets a profile ask.
    Danger,
    /// Only when it is not its default (`--json`; a table written as a
    /// sentence of its own, as `[network]` is, leaves it out of the line).
    IfSet,
}

/// One field of a table as `box profile show` writes it.
#[derive(Debug, Clone, PartialEq)]
pub struct Shown {
    /// Its key in the table.
    pub name: &'static str,
    /// Its value as text (a list without its brackets).
    pub text: String,
    /// Whether it is a list (`box profile show` writes `name [a, b]`).
    pub list: bool,
    /// Its value in the profile's words, as `--json` writes it.
    pub json: Json,
    /// Where it is shown.
    pub show: Show,
    /// Whether it is its default.
    pub default: bool,
}

impl Shown {
    /// `name value`, or `name [a, b]` for a list.
    pub fn pair(&self) -> String {
        if self.list {
            format!("{} [{}]", self.name, self.text)
        } else {
            format!("{} {}", self.name, self.text)
        }
    }
}
