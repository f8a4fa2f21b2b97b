//! Tightenings: what a session sends under `box.tighten` to narrow its profile.
//! Parsed strictly (unknown fields and wrong types are errors naming the
//! field), then applied narrow-only: every field is compared in narrowing
//! order and a wider ask is refused with the field, the value asked and the
//! profile's bound. Nothing is clamped.
//!
//! The shape mirrors the profile, and what it may name comes from the rows
//! of `profile/fields.rs`: a top-level table a row lets a session narrow
//! (`Within`: `workspace`, `network`, `limits`, `env`), a list of tables it
//! keeps some of by name (`Drop`: `servers`, `volumes`); in a table, each
//! field its row lets a session narrow (`AtMost`, `Among`), and `drop` for
//! its `Drop` fields (`env.drop`). How each is parsed and narrowed is its
//! row's rule (`rules.rs`), or the narrower its row names where it depends
//! on another field (`special.rs`).

pub(crate) mod rules;
mod special;

use serde_json::{Map, Value};

pub(crate) use rules::{Asked, Narrowing, Narrows, Tightened, rule};
use rules::{MAX_LIST, asked, invalid, object, shown, string, widening};
pub(crate) use special::{AllowWithin, ImageChoice};
use special::{dropped_variables, keep, kept_names, refuse_without_workspace};

use super::PlanError;
use crate::profile::fields::{LifecyclePolicy, PoolPolicy};
use crate::profile::{
    ByteSize, CpuQuota, EnvPolicy, LIMIT_FIELDS, LIMITS_FIELDS, LimitKind, LimitScope, LimitValue,
    NetworkPolicy, Profile, SecurityPolicy, Source, TOP_FIELDS, Workspace, parse_duration,
};

/// A parsed tightening: every field absent means "as the profile says".
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Tightening {
    /// The workspace unit (`[workspace]`).
    workspace: Asked,
    /// The workspace unit's network.
    network: Asked,
    /// The workspace unit's limits, and the session's.
    limits: LimitsAsk,
    /// The workspace unit's environment (`env.drop`).
    env: Asked,
    /// Every unit's hardening.
    security: Asked,
    /// Every unit's lifecycle.
    lifecycle: Asked,
    /// The profile's pool.
    pool: Asked,
    /// The server units to keep (all when absent).
    servers: Option<Vec<String>>,
    /// The volumes to keep (all when absent): a session can drop a volume,
    /// never add one.
    volumes: Option<Vec<String>>,
}

/// The limits a session asks for: each limit asked, with its value (in the
/// order asked; `LIMIT_FIELDS` says how each narrows).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct LimitsAsk(Vec<(&'static str, LimitValue)>);

impl LimitsAsk {
    /// What the session asked of the limit `name`, if anything.
    fn get(&self, name: &str) -> Option<LimitValue> {
        self.0
            .iter()
            .find(|(asked, _)| *asked == name)
            .map(|(_, value)| *value)
    }

    /// `limits`: each limit by its kind.
    fn parse(value: &Value) -> Result<Self, PlanError> {
        let mut ask = LimitsAsk::default();
        let fields = object(value, "limits", &LIMITS_FIELDS.names(), &LIMITS_FIELDS)?;
        for (name, value) in fields {
            let field = format!("limits.{name}");
            let Some(limit) = LIMIT_FIELDS.iter().find(|limit| limit.field.name == name) else {
                return Err(invalid(&field, "unknown field"));
            };
            let text = || string(value, &field);
            let asked = match limit.kind {
                LimitKind::Size => LimitValue::Size(
                    ByteSize::parse(text()?).map_err(|message| invalid(&field, message))?,
                ),
                LimitKind::Duration => LimitValue::Duration(
                    parse_duration(text()?).map_err(|message| invalid(&field, message))?,
                ),
                LimitKind::Count => LimitValue::Count(count(value, &field)?),
                LimitKind::Cpus => {
                    let cores = value.as_f64().ok_or_else(|| {
                        invalid(
                            &field,
                            format!("expected a number of cores like 1.5, got {}", shown(value)),
                        )
                    })?;
                    LimitValue::Cpus(
                        CpuQuota::from_cores(cores).map_err(|message| invalid(&field, message))?,
                    )
                }
            };
            ask.0.push((limit.field.name, asked));
        }
        Ok(ask)
    }
}

fn count(value: &Value, field: &str) -> Result<u64, PlanError> {
    match value.as_u64() {
        Some(0) => Err(invalid(field, "0 is not more than zero")),
        Some(number) => Ok(number),
        None => Err(invalid(
            field,
            format!("expected a whole number from 1, got {}", shown(value)),
        )),
    }
}

impl Tightening {
    /// Parse the JSON a session sends under `box.tighten` (`null` for none):
    /// the top-level keys the rows accept, in row order.
    pub fn parse(value: &Value) -> Result<Self, PlanError> {
        let mut tightening = Tightening::default();
        if value.is_null() {
            return Ok(tightening);
        }
        let keys = TOP_FIELDS.tightened();
        let accepted: Vec<&str> = keys.iter().map(String::as_str).collect();
        let top = object(value, "", &accepted, &TOP_FIELDS)?;
        for key in accepted {
            let Some(value) = top.get(key) else {
                continue;
            };
            match key {
                "workspace" => tightening.workspace = asked::<Workspace>(value, None)?,
                "network" => tightening.network = asked::<NetworkPolicy>(value, None)?,
                "limits" => tightening.limits = LimitsAsk::parse(value)?,
                "env" => tightening.env = asked::<EnvPolicy>(value, Some(dropped_variables))?,
                "security" => tightening.security = asked::<SecurityPolicy>(value, None)?,
                "lifecycle" => tightening.lifecycle = asked::<LifecyclePolicy>(value, None)?,
                "pool" => tightening.pool = asked::<PoolPolicy>(value, None)?,
                "servers" => tightening.servers = Some(kept_names(value, key)?),
                "volumes" => tightening.volumes = Some(kept_names(value, key)?),
                _ => return Err(invalid(key, "no tightening reads this table")),
            }
        }
        Ok(tightening)
    }
}

/// Check that `asked` is at most `bound` (narrowing order), naming both when not.
fn narrower<T: Ord>(
    profile: &Profile,
    field: &str,
    asked: Option<T>,
    bound: T,
    show: impl Fn(&T) -> String,
) -> Result<T, PlanError> {
    match asked {
        None => Ok(bound),
        Some(asked) if asked <= bound => Ok(asked),
        Some(asked) => Err(widening(&profile.name, field, show(&asked), show(&bound))),
    }
}

/// `profile` narrowed by `tightening`: a profile again, never wider in any
/// field. Each table's fields narrow by their rows, in row order.
pub fn tighten(profile: &Profile, tightening: &Tightening) -> Result<Profile, PlanError> {
    let name = &profile.name;
    let mut narrowed = profile.clone();
    refuse_without_workspace(profile, &tightening.workspace.names())?;
    narrowed.workspace = profile.workspace.narrow(&tightening.workspace, name)?;
    let ask = &tightening.limits;
    if profile.workspace.source == Source::None {
        // These narrow the workspace unit; with none, honouring them silently
        // would leave the session wider than it asked.
        let network = ("network".to_owned(), !tightening.network.is_empty());
        let unit_limits = LIMIT_FIELDS
            .iter()
            .filter(|limit| limit.scope == LimitScope::Unit)
            .map(|limit| {
                (
                    format!("limits.{}", limit.field.name),
                    ask.get(limit.field.name).is_some(),
                )
            });
        let unit_only: Vec<(String, bool)> = std::iter::once(network).chain(unit_limits).collect();
        if let Some((field, _)) = unit_only.iter().find(|(_, asked)| *asked) {
            return Err(invalid(
                field,
                format!(
                    "profile `{}` has no workspace unit to narrow (narrow its servers with \"servers\")",
                    profile.name
                ),
            ));
        }
    }
    narrowed.network = profile.network.narrow(&tightening.network, name)?;
    for limit in LIMIT_FIELDS {
        let field = format!("limits.{}", limit.field.name);
        let bound = (limit.get)(&profile.limits);
        let narrowed_value =
            narrower(profile, &field, ask.get(limit.field.name), bound, |value| {
                value.text()
            })?;
        (limit.set)(&mut narrowed.limits, narrowed_value);
        // The session's limits are every unit's.
        if limit.scope == LimitScope::Session {
            for server in &mut narrowed.servers {
                (limit.set)(&mut server.limits, narrowed_value);
            }
        }
    }
    narrowed.env = profile.env.narrow(&tightening.env, name)?;
    narrowed.security = profile.security.narrow(&tightening.security, name)?;
    narrowed.lifecycle = profile.lifecycle.narrow(&tightening.lifecycle, name)?;
    narrowed.pool = profile.pool.narrow(&tightening.pool, name)?;
    let servers = tightening.servers.as_ref();
    keep(
        profile,
        "servers",
        &mut narrowed.servers,
        servers,
        |server| &server.name,
    )?;
    let volumes = tightening.volumes.as_ref();
    keep(
        profile,
        "volumes",
        &mut narrowed.volumes,
        volumes,
        |volume| &volume.name,
    )?;
    Ok(narrowed)
}

/// Parse a tightening's JSON text strictly: duplicate keys are an error (a
/// plain JSON parse keeps the last one silently), and nesting deeper than
/// serde_json's recursion limit (128) is refused by the parser.
pub fn parse_tightening_text(text: &str) -> Result<Value, PlanError> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let value = serde::Deserialize::deserialize(&mut deserializer)
        .map(|strict: Strict| strict.0)
        .and_then(|value| deserializer.end().map(|()| value))
        .map_err(|error| PlanError::Invalid(format!("not valid JSON: {error}")))?;
    Ok(value)
}

/// A JSON value that refuses duplicate keys.
struct Strict(Value);

impl<'de> serde::Deserialize<'de> for Strict {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> serde::de::Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("a JSON value")
    }

    fn visit_bool<E>(self, value: bool) -> Result<Value, E> {
        Ok(Value::Bool(value))
    }

    fn visit_i64<E>(self, value: i64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_u64<E>(self, value: u64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_f64<E>(self, value: f64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_str<E>(self, value: &str) -> Result<Value, E> {
        Ok(Value::String(value.to_owned()))
    }

    fn visit_string<E>(self, value: String) -> Result<Value, E> {
        Ok(Value::String(value))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(Strict(item)) = seq.next_element()? {
            if items.len() >= MAX_LIST {
                return Err(serde::de::Error::custom(format!(
                    "an array longer than {MAX_LIST}"
                )));
            }
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                return Err(serde::de::Error::custom(format!("duplicate key `{key}`")));
            }
            let Strict(value) = map.next_value()?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}
