//! Tightenings: what a session sends under `box.tighten` to narrow its profile.
//! Parsed strictly (unknown fields and wrong types are errors), then applied
//! narrow-only: every field is compared in narrowing order and a wider ask is
//! refused with the field, the value asked and the profile's bound. Nothing is
//! clamped.
//!
//! The shape mirrors the profile:
//! `{"workspace": {"mode", "image", "local_userland"}, "network": {"mode", "allow"}, "limits": {...},
//!   "servers": [NAME...], "volumes": [NAME...], "env": {"drop": [NAME...]}}`.

use serde_json::{Map, Value};

use super::{LocalUserland, MountMode, NetworkMode, PlanError};
use crate::allow::{AllowList, Rule};
use crate::profile::{
    ByteSize, Choice, CpuQuota, ENV_FIELDS, LIMIT_FIELDS, LIMITS_FIELDS, LimitKind, LimitScope,
    LimitValue, NETWORK_FIELDS, Profile, Source, TOP_FIELDS, Table, WORKSPACE_FIELDS,
    check_env_name, parse_duration,
};

/// A parsed tightening: every field absent means "as the profile says".
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Tightening {
    /// The workspace's mount mode.
    pub workspace_mode: Option<MountMode>,
    /// The workspace unit's image: the profile's `image` or one of its `images`.
    pub workspace_image: Option<String>,
    /// Whether the local backend may run the workspace unit on the host's userland.
    pub workspace_local_userland: Option<LocalUserland>,
    /// The workspace unit's network.
    pub network: NetworkAsk,
    /// The workspace unit's limits.
    pub limits: LimitsAsk,
    /// The server units to keep (all when absent).
    pub servers: Option<Vec<String>>,
    /// The volumes to keep (all when absent): a session can drop a volume,
    /// never add one.
    pub volumes: Option<Vec<String>>,
    /// Variables removed from the workspace unit (set, passed or secret).
    pub env_drop: Vec<String>,
}

/// The network a session asks for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NetworkAsk {
    /// How much network.
    pub mode: Option<NetworkMode>,
    /// For `egress`: a subset of the profile's allow list.
    pub allow: Option<Vec<Rule>>,
}

/// The limits a session asks for: each limit asked, with its value (in the
/// order asked; `LIMIT_FIELDS` says how each narrows).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LimitsAsk(Vec<(&'static str, LimitValue)>);

impl LimitsAsk {
    /// What the session asked of the limit `name`, if anything.
    fn get(&self, name: &str) -> Option<LimitValue> {
        self.0
            .iter()
            .find(|(asked, _)| *asked == name)
            .map(|(_, value)| *value)
    }
}

const TOP: &[&str] = &[
    "workspace",
    "network",
    "limits",
    "servers",
    "volumes",
    "env",
];
const WORKSPACE: &[&str] = &["mode", "image", "local_userland"];
const NETWORK: &[&str] = &["mode", "allow"];
const ENV: &[&str] = &["drop"];

/// The most entries a list in a tightening may have; more is an attack, not a session.
const MAX_LIST: usize = 1024;

fn invalid(field: &str, message: impl std::fmt::Display) -> PlanError {
    PlanError::Invalid(format!("{field}: {message}"))
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// An object's fields; refuses a non-object and every key not `accepted`,
/// saying of one of the profile's own fields (`profile`, the same table in a
/// profile) that a session cannot tighten it.
fn object<'a>(
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

fn string<'a>(value: &'a Value, field: &str) -> Result<&'a str, PlanError> {
    value
        .as_str()
        .ok_or_else(|| invalid(field, format!("expected a string, got {}", kind(value))))
}

/// One of a choice's words, the same as a profile's.
fn choice<T: Choice>(value: &Value, field: &str) -> Result<T, PlanError> {
    T::from_word(string(value, field)?).map_err(|message| invalid(field, message))
}

fn strings<'a>(value: &'a Value, field: &str) -> Result<Vec<&'a str>, PlanError> {
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

fn shown(value: &Value) -> String {
    match value {
        Value::Array(_) | Value::Object(_) => kind(value).to_owned(),
        _ => value.to_string(),
    }
}

impl Tightening {
    /// Parse the JSON a session sends under `box.tighten` (`null` for none).
    pub fn parse(value: &Value) -> Result<Self, PlanError> {
        let mut tightening = Tightening::default();
        if value.is_null() {
            return Ok(tightening);
        }
        let top = object(value, "", TOP, &TOP_FIELDS)?;
        if let Some(workspace) = top.get("workspace") {
            let fields = object(workspace, "workspace", WORKSPACE, &WORKSPACE_FIELDS)?;
            if let Some(mode) = fields.get("mode") {
                tightening.workspace_mode = Some(choice(mode, "workspace.mode")?);
            }
            if let Some(image) = fields.get("image") {
                let image = string(image, "workspace.image")?;
                crate::image::ImageRef::parse(image)
                    .map_err(|message| invalid("workspace.image", message))?;
                tightening.workspace_image = Some(image.to_owned());
            }
            if let Some(userland) = fields.get("local_userland") {
                tightening.workspace_local_userland =
                    Some(choice(userland, "workspace.local_userland")?);
            }
        }
        if let Some(network) = top.get("network") {
            let fields = object(network, "network", NETWORK, &NETWORK_FIELDS)?;
            if let Some(mode) = fields.get("mode") {
                tightening.network.mode = Some(choice(mode, "network.mode")?);
            }
            if let Some(allow) = fields.get("allow") {
                let entries = strings(allow, "network.allow")?
                    .into_iter()
                    .map(|text| {
                        Rule::parse(text)
                            .map_err(|error| invalid("network.allow", error.to_string()))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                tightening.network.allow = Some(entries);
            }
        }
        if let Some(limits) = top.get("limits") {
            let fields = object(limits, "limits", &LIMITS_FIELDS.names(), &LIMITS_FIELDS)?;
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
                                format!(
                                    "expected a number of cores like 1.5, got {}",
                                    shown(value)
                                ),
                            )
                        })?;
                        LimitValue::Cpus(
                            CpuQuota::from_cores(cores)
                                .map_err(|message| invalid(&field, message))?,
                        )
                    }
                };
                tightening.limits.0.push((limit.field.name, asked));
            }
        }
        if let Some(servers) = top.get("servers") {
            let mut names: Vec<String> = Vec::new();
            for name in strings(servers, "servers")? {
                if !names.iter().any(|seen| seen == name) {
                    names.push(name.to_owned());
                }
            }
            tightening.servers = Some(names);
        }
        if let Some(volumes) = top.get("volumes") {
            let mut names: Vec<String> = Vec::new();
            for name in strings(volumes, "volumes")? {
                if !names.iter().any(|seen| seen == name) {
                    names.push(name.to_owned());
                }
            }
            tightening.volumes = Some(names);
        }
        if let Some(env) = top.get("env") {
            let fields = object(env, "env", ENV, &ENV_FIELDS)?;
            if let Some(drop) = fields.get("drop") {
                for name in strings(drop, "env.drop")? {
                    check_env_name(name).map_err(|message| invalid("env.drop", message))?;
                    if !tightening.env_drop.iter().any(|seen| seen == name) {
                        tightening.env_drop.push(name.to_owned());
                    }
                }
            }
        }
        Ok(tightening)
    }
}

fn list<T: std::fmt::Display>(items: &[T]) -> String {
    let shown: Vec<String> = items.iter().map(ToString::to_string).collect();
    format!("[{}]", shown.join(", "))
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
        Some(asked) => Err(PlanError::Widening {
            profile: profile.name.clone(),
            field: field.to_owned(),
            asked: show(&asked),
            bound: show(&bound),
        }),
    }
}

/// `profile` narrowed by `tightening`: a profile again, never wider in any field.
pub fn tighten(profile: &Profile, tightening: &Tightening) -> Result<Profile, PlanError> {
    let mut narrowed = profile.clone();
    if let Some(mode) = tightening.workspace_mode {
        if profile.workspace.source == Source::None {
            return Err(invalid(
                "workspace.mode",
                format!("profile `{}` has no workspace to narrow", profile.name),
            ));
        }
        narrowed.workspace.mode = narrower(
            profile,
            "workspace.mode",
            Some(mode),
            profile.workspace.mode,
            |mode| format!("\"{}\"", mode.as_str()),
        )?;
    }
    if let Some(image) = &tightening.workspace_image {
        if profile.workspace.source == Source::None {
            return Err(invalid(
                "workspace.image",
                format!("profile `{}` has no workspace unit", profile.name),
            ));
        }
        // A choice among the operator's images, never an image of the session's own.
        let offered: Vec<&String> = std::iter::once(&profile.workspace.image)
            .chain(&profile.workspace.images)
            .collect();
        if !offered.contains(&image) {
            return Err(PlanError::Widening {
                profile: profile.name.clone(),
                field: "workspace.image".to_owned(),
                asked: format!("{image:?}"),
                bound: format!(
                    "{} (its image and images)",
                    list(
                        &offered
                            .iter()
                            .map(|image| format!("{image:?}"))
                            .collect::<Vec<_>>()
                    )
                ),
            });
        }
        // The profile's leave to run on the host's userland covers its own
        // image: a session that chooses another one gets it or a refusal.
        if *image != profile.workspace.image {
            narrowed.workspace.local_userland = LocalUserland::Refuse;
        }
        narrowed.workspace.image = image.clone();
    }
    if let Some(userland) = tightening.workspace_local_userland {
        if profile.workspace.source == Source::None {
            return Err(invalid(
                "workspace.local_userland",
                format!("profile `{}` has no workspace unit", profile.name),
            ));
        }
        narrowed.workspace.local_userland = narrower(
            profile,
            "workspace.local_userland",
            Some(userland),
            narrowed.workspace.local_userland,
            |userland| format!("\"{}\"", userland.as_str()),
        )?;
    }
    let ask = &tightening.limits;
    if profile.workspace.source == Source::None {
        // These narrow the workspace unit; with none, honouring them silently
        // would leave the session wider than it asked.
        let network = (
            "network".to_owned(),
            tightening.network != NetworkAsk::default(),
        );
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
    narrowed.network = tighten_network(profile, &tightening.network)?;
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
    if let Some(names) = &tightening.servers {
        let known: Vec<&str> = profile
            .servers
            .iter()
            .map(|server| server.name.as_str())
            .collect();
        if let Some(unknown) = names.iter().find(|name| !known.contains(&name.as_str())) {
            return Err(PlanError::Widening {
                profile: profile.name.clone(),
                field: "servers".to_owned(),
                asked: format!("{unknown:?}"),
                bound: list(&known),
            });
        }
        narrowed
            .servers
            .retain(|server| names.contains(&server.name));
    }
    if let Some(names) = &tightening.volumes {
        let known: Vec<&str> = profile
            .volumes
            .iter()
            .map(|volume| volume.name.as_str())
            .collect();
        if let Some(unknown) = names.iter().find(|name| !known.contains(&name.as_str())) {
            return Err(PlanError::Widening {
                profile: profile.name.clone(),
                field: "volumes".to_owned(),
                asked: format!("{unknown:?}"),
                bound: list(&known),
            });
        }
        narrowed
            .volumes
            .retain(|volume| names.contains(&volume.name));
    }
    for name in &tightening.env_drop {
        narrowed.env.set.remove(name);
        narrowed.env.pass.retain(|pass| pass != name);
        narrowed.env.secrets.retain(|secret| secret.name != *name);
    }
    Ok(narrowed)
}

fn tighten_network(
    profile: &Profile,
    ask: &NetworkAsk,
) -> Result<crate::profile::NetworkPolicy, PlanError> {
    let bound = &profile.network;
    let mode = narrower(profile, "network.mode", ask.mode, bound.mode, |mode| {
        format!("\"{}\"", mode.as_str())
    })?;
    let allow = match (mode, &ask.allow) {
        (NetworkMode::None | NetworkMode::Bridge, None) => Vec::new(),
        (NetworkMode::None | NetworkMode::Bridge, Some(allow)) if allow.is_empty() => Vec::new(),
        (NetworkMode::None | NetworkMode::Bridge, Some(_)) => {
            return Err(invalid(
                "network.allow",
                format!(
                    "an allow list only applies to mode \"egress\", but the mode is \"{}\"",
                    mode.as_str()
                ),
            ));
        }
        (NetworkMode::Egress, None) => match bound.mode {
            NetworkMode::Egress => bound.allow.clone(),
            NetworkMode::None | NetworkMode::Bridge => {
                return Err(invalid(
                    "network.allow",
                    "mode \"egress\" needs an allow list of host[:port] entries",
                ));
            }
        },
        (NetworkMode::Egress, Some(allow)) => {
            if allow.is_empty() {
                return Err(invalid(
                    "network.allow",
                    "an empty allow list reaches nothing; ask mode \"none\" instead",
                ));
            }
            // Set inclusion, port by port, as the egress proxy narrows a running unit.
            let bounds = AllowList::new(bound.allow.iter().cloned());
            if bound.mode == NetworkMode::Egress
                && let Some(wider) = allow.iter().find(|entry| !entry.is_within(&bounds))
            {
                return Err(PlanError::Widening {
                    profile: profile.name.clone(),
                    field: "network.allow".to_owned(),
                    asked: format!("\"{wider}\""),
                    bound: list(&bound.allow),
                });
            }
            let mut unique: Vec<Rule> = Vec::new();
            for entry in allow {
                if !unique.contains(entry) {
                    unique.push(entry.clone());
                }
            }
            unique
        }
    };
    // Every other field is the operator's, never the session's (declared
    // `Tighten::No`); pinned names and the proxy's limits follow the mode.
    let mut narrowed = bound.clone();
    narrowed.mode = mode;
    narrowed.allow = allow;
    if mode != NetworkMode::Egress {
        narrowed.hosts = Default::default();
        narrowed.max_connections = None;
        narrowed.bandwidth = None;
    }
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
