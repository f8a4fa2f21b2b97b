//! How a session's tightening reads and narrows a field, by its row's rule in
//! `profile/fields.rs` (`Tighten`): `No`, `AtMost` (narrower-only, in the
//! type's order), `Among` (a subset of the profile's list), `Drop` (entries
//! removed by name). `table!` gives every table a [`Tightened`] from its
//! rows, so which keys a tightening accepts, how each is parsed and how it
//! narrows come from the row; a field whose narrowing depends on another
//! field names a narrower of its own in its row (`special.rs`), as a field
//! whose reading is special names a reader.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Map, Value};

use super::super::PlanError;
use crate::profile::fields::{Table, Tighten};
use crate::profile::{ByteSize, Choice, Secret, parse_duration, show_duration};

/// The most entries a list in a tightening may have; more is an attack, not a session.
pub(crate) const MAX_LIST: usize = 1024;

/// A malformed tightening, naming the field.
pub(crate) fn invalid(field: &str, message: impl std::fmt::Display) -> PlanError {
    PlanError::Invalid(format!("{field}: {message}"))
}

/// An ask wider than the profile, naming the field, the ask and the bound.
pub(crate) fn widening(profile: &str, field: &str, asked: String, bound: String) -> PlanError {
    PlanError::Widening {
        profile: profile.to_owned(),
        field: field.to_owned(),
        asked,
        bound,
    }
}

/// What a JSON value is, as an error says it.
pub(crate) fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A JSON value as an error shows what was asked: a scalar as written.
pub(crate) fn shown(value: &Value) -> String {
    match value {
        Value::Array(_) | Value::Object(_) => kind(value).to_owned(),
        _ => value.to_string(),
    }
}

/// `[a, b]`.
pub(crate) fn list<T: std::fmt::Display>(items: &[T]) -> String {
    let shown: Vec<String> = items.iter().map(ToString::to_string).collect();
    format!("[{}]", shown.join(", "))
}

pub(crate) fn string<'a>(value: &'a Value, field: &str) -> Result<&'a str, PlanError> {
    value
        .as_str()
        .ok_or_else(|| invalid(field, format!("expected a string, got {}", kind(value))))
}

pub(crate) fn strings<'a>(value: &'a Value, field: &str) -> Result<Vec<&'a str>, PlanError> {
    let Value::Array(items) = value else {
        return Err(invalid(
            field,
            format!("expected an array of strings, got {}", kind(value)),
        ));
    };
    if items.len() > MAX_LIST {
        return Err(invalid(
            field,
            format!("{} entries is more than {MAX_LIST}", items.len()),
        ));
    }
    items.iter().map(|item| string(item, field)).collect()
}

/// An object's fields; refuses a non-object and every key not `accepted`,
/// saying of one of the profile's own fields (`profile`, the same table in a
/// profile) that a session cannot tighten it.
pub(crate) fn object<'a>(
    value: &'a Value,
    field: &str,
    accepted: &[&str],
    profile: &Table,
) -> Result<&'a Map<String, Value>, PlanError> {
    let Value::Object(map) = value else {
        let prefix = if field.is_empty() {
            String::new()
        } else {
            format!("{field}: ")
        };
        return Err(PlanError::Invalid(format!(
            "{prefix}expected an object with fields {}, got {}",
            accepted.join(", "),
            kind(value)
        )));
    };
    for key in map.keys() {
        if !accepted.contains(&key.as_str()) {
            let path = if field.is_empty() {
                key.clone()
            } else {
                format!("{field}.{key}")
            };
            let accepted = accepted.join(", ");
            return Err(invalid(
                &path,
                match (field, key.as_str()) {
                    ("", "image") => "unknown field; a session chooses the workspace unit's image as workspace.image, from the profile's image and images".to_owned(),
                    _ if profile.names().contains(&key.as_str()) => format!(
                        "a profile's field, which a session cannot tighten (a profile that extends this one can set it); a session tightens here: {accepted}"
                    ),
                    _ => format!("unknown field; accepted here: {accepted}"),
                },
            ));
        }
    }
    Ok(map)
}

/// The key a tightening drops a table's `Drop` fields' entries under (`env.drop`).
pub(crate) const DROP: &str = "drop";

impl Table {
    /// What a tightening may name in this table, in row order: a field a
    /// session narrows (`AtMost`, `Among`), and `drop` once for the fields
    /// it drops entries from; at the top level, a table it narrows
    /// (`Within`) and a list of tables it drops from by its plural (`servers`).
    pub(crate) fn tightened(&self) -> Vec<String> {
        let mut keys: Vec<String> = Vec::new();
        for field in self.fields {
            let key = match (self.path, field.tighten) {
                (_, Tighten::No) => continue,
                ("", Tighten::Drop) => format!("{}s", field.name),
                (_, Tighten::Drop) => DROP.to_owned(),
                _ => field.name.to_owned(),
            };
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        keys
    }
}

/// A field's type as a session asks it: read from the tightening's JSON
/// (an error naming the field when it is not one) and shown in a refusal.
pub(crate) trait Asks: Sized {
    /// The value at `field`.
    fn from_json(value: &Value, field: &str) -> Result<Self, PlanError>;

    /// As a refused tightening writes it.
    fn shown(&self) -> String;
}

/// A choice in the profile's words: `"ro"`.
impl<T: Choice> Asks for T {
    fn from_json(value: &Value, field: &str) -> Result<Self, PlanError> {
        T::from_word(string(value, field)?).map_err(|message| invalid(field, message))
    }

    fn shown(&self) -> String {
        format!("\"{}\"", self.name())
    }
}

impl Asks for bool {
    fn from_json(value: &Value, field: &str) -> Result<Self, PlanError> {
        value
            .as_bool()
            .ok_or_else(|| invalid(field, format!("expected a boolean, got {}", kind(value))))
    }

    fn shown(&self) -> String {
        self.to_string()
    }
}

impl Asks for String {
    fn from_json(value: &Value, field: &str) -> Result<Self, PlanError> {
        string(value, field).map(str::to_owned)
    }

    fn shown(&self) -> String {
        format!("{self:?}")
    }
}

/// A size as a profile writes it (`"1GiB"`).
impl Asks for ByteSize {
    fn from_json(value: &Value, field: &str) -> Result<Self, PlanError> {
        ByteSize::parse(string(value, field)?).map_err(|message| invalid(field, message))
    }

    fn shown(&self) -> String {
        self.to_string()
    }
}

/// A duration as a profile writes it (`"10m"`).
impl Asks for Duration {
    fn from_json(value: &Value, field: &str) -> Result<Self, PlanError> {
        parse_duration(string(value, field)?).map_err(|message| invalid(field, message))
    }

    fn shown(&self) -> String {
        show_duration(*self)
    }
}

/// A whole number, as a JSON number.
impl Asks for u64 {
    fn from_json(value: &Value, field: &str) -> Result<Self, PlanError> {
        value.as_u64().ok_or_else(|| {
            invalid(
                field,
                format!("expected a whole number, got {}", shown(value)),
            )
        })
    }

    fn shown(&self) -> String {
        self.to_string()
    }
}

impl Asks for usize {
    fn from_json(value: &Value, field: &str) -> Result<Self, PlanError> {
        u64::from_json(value, field).map(|count| usize::try_from(count).unwrap_or(usize::MAX))
    }

    fn shown(&self) -> String {
        self.to_string()
    }
}

impl Asks for Vec<String> {
    fn from_json(value: &Value, field: &str) -> Result<Self, PlanError> {
        Ok(strings(value, field)?
            .into_iter()
            .map(str::to_owned)
            .collect())
    }

    fn shown(&self) -> String {
        list(self)
    }
}

/// A field of table `S` of type `T` in a session's tightening: how it is
/// asked for and how it narrows the profile's. A row's rule (`AtMost`, ...)
/// is one, generic over the field's type; a field whose narrowing depends
/// on another field names one of its own (`special.rs`).
pub(crate) trait Narrows<T, S> {
    /// The field as a session asks it, at `field` (a path: `workspace.mode`).
    fn parse(value: &Value, field: &str) -> Result<T, PlanError>;

    /// The field narrowed, or refused naming it when the ask is wider.
    fn narrow(narrowing: Narrowing<'_, T, S>) -> Result<T, PlanError>;

    /// Remove the entry `name` (a rule that drops entries by name).
    fn drop_named(_value: &mut T, _name: &str) {}
}

/// One field's narrowing: what was asked, and the table it narrows.
pub(crate) struct Narrowing<'a, T, S> {
    /// What the session asked (`None`: nothing).
    pub(crate) asked: Option<T>,
    /// The field as the fields before it in its table left it: the
    /// profile's, unless an earlier field's narrowing changed it (a chosen
    /// image clears `local_userland`).
    pub(crate) current: T,
    /// The profile's table.
    pub(crate) bound: &'a S,
    /// The table narrowed so far (the fields before this one).
    pub(crate) narrowed: &'a mut S,
    /// Its path (`workspace.mode`).
    pub(crate) field: &'a str,
    /// The profile's name.
    pub(crate) profile: &'a str,
}

/// The rules a row may name, as types (`Tighten`'s values).
pub(crate) mod rule {
    use serde_json::Value;

    use super::{Asks, Named, Narrowing, Narrows, PlanError, invalid, list, widening};

    /// A profile's field a session cannot tighten: a tightening naming it is
    /// refused before it is parsed.
    pub(crate) struct No;

    impl<T, S> Narrows<T, S> for No {
        fn parse(_: &Value, field: &str) -> Result<T, PlanError> {
            Err(invalid(field, "a session cannot tighten it"))
        }

        fn narrow(narrowing: Narrowing<'_, T, S>) -> Result<T, PlanError> {
            Ok(narrowing.current)
        }
    }

    /// At most the profile's value, in the type's order (a choice's
    /// declaration order, sizes, durations, counts, `false` < `true`).
    pub(crate) struct AtMost;

    impl<T: Asks + Ord, S> Narrows<T, S> for AtMost {
        fn parse(value: &Value, field: &str) -> Result<T, PlanError> {
            T::from_json(value, field)
        }

        fn narrow(narrowing: Narrowing<'_, T, S>) -> Result<T, PlanError> {
            match narrowing.asked {
                None => Ok(narrowing.current),
                Some(asked) if asked <= narrowing.current => Ok(asked),
                Some(asked) => Err(widening(
                    narrowing.profile,
                    narrowing.field,
                    asked.shown(),
                    narrowing.current.shown(),
                )),
            }
        }
    }

    /// A subset of the profile's list (each entry once, in the order asked).
    #[cfg_attr(
        not(test),
        expect(
            dead_code,
            reason = "every list a session narrows today names a narrower of its own (`network.allow`)"
        )
    )]
    pub(crate) struct Among;

    impl<T: Asks + PartialEq + Clone, S> Narrows<Vec<T>, S> for Among {
        fn parse(value: &Value, field: &str) -> Result<Vec<T>, PlanError> {
            let Value::Array(items) = value else {
                return Err(invalid(
                    field,
                    format!("expected an array, got {}", super::kind(value)),
                ));
            };
            items.iter().map(|item| T::from_json(item, field)).collect()
        }

        fn narrow(narrowing: Narrowing<'_, Vec<T>, S>) -> Result<Vec<T>, PlanError> {
            let Some(asked) = narrowing.asked else {
                return Ok(narrowing.current);
            };
            let mut kept: Vec<T> = Vec::new();
            for entry in asked {
                if !narrowing.current.contains(&entry) {
                    let bound: Vec<String> = narrowing.current.iter().map(T::shown).collect();
                    return Err(widening(
                        narrowing.profile,
                        narrowing.field,
                        entry.shown(),
                        list(&bound),
                    ));
                }
                if !kept.contains(&entry) {
                    kept.push(entry);
                }
            }
            Ok(kept)
        }
    }

    /// Entries removed by name (a table's `drop`): never named itself.
    pub(crate) struct Drop;

    impl<T: Named, S> Narrows<T, S> for Drop {
        fn parse(_: &Value, field: &str) -> Result<T, PlanError> {
            Err(invalid(field, "a session drops its entries with drop"))
        }

        fn narrow(narrowing: Narrowing<'_, T, S>) -> Result<T, PlanError> {
            Ok(narrowing.current)
        }

        fn drop_named(value: &mut T, name: &str) {
            value.drop_named(name);
        }
    }
}

/// A field whose entries are named, so a tightening drops them by name.
pub(crate) trait Named {
    /// Remove the entry called `name` (none: nothing).
    fn drop_named(&mut self, name: &str);
}

impl<V> Named for BTreeMap<String, V> {
    fn drop_named(&mut self, name: &str) {
        self.remove(name);
    }
}

impl Named for Vec<String> {
    fn drop_named(&mut self, name: &str) {
        self.retain(|entry| entry != name);
    }
}

/// A table's name (a `[[server]]`'s `name`, declared `Drop`): the entry it
/// names is dropped as a whole by the top level's list (`servers`), so the
/// field itself loses nothing.
impl Named for String {
    fn drop_named(&mut self, _name: &str) {}
}

impl Named for Vec<Secret> {
    fn drop_named(&mut self, name: &str) {
        self.retain(|secret| secret.name != name);
    }
}

/// What a session asked of one table: each field it names, as written,
/// and the names it drops.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Asked {
    /// The fields it asked, in row order, each as the session wrote it: read
    /// once by its rule to refuse a wrong one at parse, and again to narrow
    /// (so a table is asked of without a value for every field).
    pub(crate) fields: Vec<(String, Value)>,
    /// The names it drops from the table's `Drop` fields (`env.drop`).
    pub(crate) drop: Vec<String>,
}

impl Asked {
    /// Whether it asks anything of the table.
    pub(crate) fn is_empty(&self) -> bool {
        self.fields.is_empty() && self.drop.is_empty()
    }

    /// The fields it asked, in row order.
    pub(crate) fn names(&self) -> Vec<&str> {
        self.fields.iter().map(|(name, _)| name.as_str()).collect()
    }

    /// What it wrote for the field `name`, if it asked it.
    pub(crate) fn get(&self, name: &str) -> Option<&Value> {
        self.fields
            .iter()
            .find(|(asked, _)| asked == name)
            .map(|(_, value)| value)
    }
}

/// A profile table a session's tightening narrows field by field, from its
/// rows (`table!` implements it).
pub(crate) trait Tightened: Sized {
    /// Its rows.
    const TABLE: &'static Table;

    /// Check the field `name` (one its row lets a session narrow) as its
    /// row's rule reads it: a wrong type or value is refused naming it.
    fn ask(name: &str, value: &Value) -> Result<(), PlanError>;

    /// `self`, the profile's table, narrowed by `asked`: every field by its
    /// row's rule, in row order, and every entry `asked` drops removed.
    fn narrow(&self, asked: &Asked, profile: &str) -> Result<Self, PlanError>;
}

/// Reads the names a table's `drop` lists (`env.drop`: variables' names).
pub(crate) type DropReader = fn(&Value, &str) -> Result<Vec<String>, PlanError>;

/// A session's tightening of the table `S` (the object under its key): the
/// keys its rows accept, each parsed by its rule; `drop` by `drop`, a reader
/// of names (`None`: the table has no `Drop` field).
pub(crate) fn asked<S: Tightened>(
    value: &Value,
    drop: Option<DropReader>,
) -> Result<Asked, PlanError> {
    let table = S::TABLE;
    let keys = table.tightened();
    let accepted: Vec<&str> = keys.iter().map(String::as_str).collect();
    let fields = object(value, table.path, &accepted, table)?;
    let mut asked = Asked::default();
    for key in accepted {
        let Some(value) = fields.get(key) else {
            continue;
        };
        if key == DROP {
            let field = format!("{}.{DROP}", table.path);
            let Some(read) = drop else {
                return Err(invalid(&field, "nothing here is dropped by name"));
            };
            asked.drop = read(value, &field)?;
        } else {
            S::ask(key, value)?;
            asked.fields.push((key.to_owned(), value.clone()));
        }
    }
    Ok(asked)
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::rule::{Among, AtMost, Drop, No};
    use super::{Asks, Narrowing, Narrows};
    use crate::profile::ByteSize;

    /// `field` asked `ask` of a profile whose value is `bound`, by the rule
    /// `R`, in a table of nothing else: the narrowed value or the error.
    fn narrow<R: Narrows<T, ()>, T>(ask: Option<Value>, bound: T) -> Result<T, String> {
        let asked = ask
            .map(|value| R::parse(&value, "t.field"))
            .transpose()
            .map_err(|error| error.to_string())?;
        R::narrow(Narrowing {
            asked,
            current: bound,
            bound: &(),
            narrowed: &mut (),
            field: "t.field",
            profile: "p",
        })
        .map_err(|error| error.to_string())
    }

    fn wider<T>(asked: &str, bound: &str) -> Result<T, String> {
        Err(format!(
            "tighten.t.field: asked for {asked}, but profile `p` allows at most {bound}"
        ))
    }

    /// Each rule narrows any type it is written for, so a row needs no code
    /// of its own: narrower and equal asks kept, wider ones refused naming
    /// the field, the ask and the bound, wrong types refused naming the field.
    #[test]
    fn every_rule_narrows_by_its_type() {
        assert_eq!(narrow::<AtMost, bool>(Some(json!(false)), true), Ok(false));
        assert_eq!(narrow::<AtMost, bool>(None, true), Ok(true));
        assert_eq!(
            narrow::<AtMost, bool>(Some(json!(true)), false),
            wider("true", "false")
        );
        assert_eq!(
            narrow::<AtMost, bool>(Some(json!("yes")), true),
            Err("tighten: t.field: expected a boolean, got a string".to_owned())
        );
        let gib = ByteSize(1 << 30);
        assert_eq!(
            narrow::<AtMost, ByteSize>(Some(json!("512MiB")), gib),
            Ok(ByteSize(512 << 20))
        );
        assert_eq!(
            narrow::<AtMost, ByteSize>(Some(json!("2GiB")), gib),
            wider("2GiB", "1GiB")
        );
        let minute = std::time::Duration::from_secs(60);
        assert_eq!(
            narrow::<AtMost, std::time::Duration>(Some(json!("30s")), minute),
            Ok(std::time::Duration::from_secs(30))
        );
        assert_eq!(
            narrow::<AtMost, std::time::Duration>(Some(json!("2m")), minute),
            wider("2m", "1m")
        );
        assert_eq!(narrow::<AtMost, u64>(Some(json!(8)), 8), Ok(8));
        assert_eq!(narrow::<AtMost, u64>(Some(json!(9)), 8), wider("9", "8"));
        assert_eq!(
            narrow::<AtMost, u64>(Some(json!(-1)), 8),
            Err("tighten: t.field: expected a whole number, got -1".to_owned())
        );
        let list = || vec!["a".to_owned(), "b".to_owned()];
        assert_eq!(
            narrow::<Among, Vec<String>>(Some(json!(["b", "b"])), list()),
            Ok(vec!["b".to_owned()])
        );
        assert_eq!(
            narrow::<Among, Vec<String>>(Some(json!(["c"])), list()),
            wider("\"c\"", "[\"a\", \"b\"]")
        );
        assert_eq!(narrow::<No, u64>(None, 8), Ok(8));
        assert_eq!(narrow::<Drop, Vec<String>>(None, list()), Ok(list()));
        let mut dropped = list();
        <Drop as Narrows<Vec<String>, ()>>::drop_named(&mut dropped, "a");
        assert_eq!(dropped, vec!["b".to_owned()]);
        assert_eq!(true.shown(), "true");
    }
}
