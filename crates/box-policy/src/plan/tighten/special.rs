//! Tightening's narrowers and readers beyond a rule, each for a field whose
//! narrowing depends on another field (as validation's special readers live
//! in `profile/validate/`): the workspace image among the profile's `image`
//! and `images`, which clears `local_userland`; `network.allow` against the
//! mode; the names a session keeps (`servers`, `volumes`) or drops
//! (`env.drop`); and a profile with no workspace unit to narrow.

use serde_json::Value;

use super::super::{LocalUserland, NetworkMode, PlanError};
use super::rules::{Narrowing, Narrows, invalid, list, string, strings, widening};
use crate::allow::{AllowList, Rule};
use crate::profile::{NetworkPolicy, Profile, Source, Workspace, check_env_name};

/// `workspace.image`: one of the profile's `image` and `images`, never an
/// image of the session's own; another than `image` clears `local_userland`
/// (the profile's leave to run on the host's userland covers its own image).
pub(crate) struct ImageChoice;

impl Narrows<String, Workspace> for ImageChoice {
    fn parse(value: &Value, field: &str) -> Result<String, PlanError> {
        let image = string(value, field)?;
        crate::image::ImageRef::parse(image).map_err(|message| invalid(field, message))?;
        Ok(image.to_owned())
    }

    fn narrow(narrowing: Narrowing<'_, String, Workspace>) -> Result<String, PlanError> {
        let Some(image) = narrowing.asked else {
            return Ok(narrowing.current);
        };
        let bound = narrowing.bound;
        let offered: Vec<&String> = std::iter::once(&bound.image).chain(&bound.images).collect();
        if !offered.contains(&&image) {
            let quoted: Vec<String> = offered.iter().map(|image| format!("{image:?}")).collect();
            return Err(widening(
                narrowing.profile,
                narrowing.field,
                format!("{image:?}"),
                format!("{} (its image and images)", list(&quoted)),
            ));
        }
        if image != bound.image {
            narrowing.narrowed.local_userland = LocalUserland::Refuse;
        }
        Ok(image)
    }
}

/// `network.allow`, against the mode (narrowed before it): with `egress`,
/// within the profile's list, port by port, as the egress proxy narrows a
/// running unit (any list is narrower than a `bridge` profile's); with
/// another mode, none. The proxy's other settings follow the mode too.
pub(crate) struct AllowWithin;

impl Narrows<Vec<Rule>, NetworkPolicy> for AllowWithin {
    fn parse(value: &Value, field: &str) -> Result<Vec<Rule>, PlanError> {
        strings(value, field)?
            .into_iter()
            .map(|text| Rule::parse(text).map_err(|error| invalid(field, error.to_string())))
            .collect()
    }

    fn narrow(narrowing: Narrowing<'_, Vec<Rule>, NetworkPolicy>) -> Result<Vec<Rule>, PlanError> {
        let bound = narrowing.bound;
        let field = narrowing.field;
        let mode = narrowing.narrowed.mode;
        let allow = match (mode, narrowing.asked) {
            (NetworkMode::None | NetworkMode::Bridge, None) => Vec::new(),
            (NetworkMode::None | NetworkMode::Bridge, Some(allow)) if allow.is_empty() => {
                Vec::new()
            }
            (NetworkMode::None | NetworkMode::Bridge, Some(_)) => {
                return Err(invalid(
                    field,
                    format!(
                        "an allow list only applies to mode \"egress\", but the mode is \"{}\"",
                        mode.as_str()
                    ),
                ));
            }
            (NetworkMode::Egress, None) => match bound.mode {
                NetworkMode::Egress => narrowing.current,
                NetworkMode::None | NetworkMode::Bridge => {
                    return Err(invalid(
                        field,
                        "mode \"egress\" needs an allow list of host[:port] entries",
                    ));
                }
            },
            (NetworkMode::Egress, Some(allow)) => {
                if allow.is_empty() {
                    return Err(invalid(
                        field,
                        "an empty allow list reaches nothing; ask mode \"none\" instead",
                    ));
                }
                let bounds = AllowList::new(bound.allow.iter().cloned());
                if bound.mode == NetworkMode::Egress
                    && let Some(wider) = allow.iter().find(|entry| !entry.is_within(&bounds))
                {
                    return Err(widening(
                        narrowing.profile,
                        field,
                        format!("\"{wider}\""),
                        list(&bound.allow),
                    ));
                }
                let mut unique: Vec<Rule> = Vec::new();
                for entry in allow {
                    if !unique.contains(&entry) {
                        unique.push(entry);
                    }
                }
                unique
            }
        };
        // Pinned names and the proxy's limits are the operator's (`No`) and
        // follow an egress unit only.
        if mode != NetworkMode::Egress {
            let narrowed = narrowing.narrowed;
            narrowed.hosts = Default::default();
            narrowed.max_connections = None;
            narrowed.bandwidth = None;
        }
        Ok(allow)
    }
}

/// `servers`, `volumes`: the names a session keeps, each once.
pub(crate) fn kept_names(value: &Value, field: &str) -> Result<Vec<String>, PlanError> {
    let mut names: Vec<String> = Vec::new();
    for name in strings(value, field)? {
        if !names.iter().any(|seen| seen == name) {
            names.push(name.to_owned());
        }
    }
    Ok(names)
}

/// `env.drop`: variables' names, each once.
pub(crate) fn dropped_variables(value: &Value, field: &str) -> Result<Vec<String>, PlanError> {
    let mut names: Vec<String> = Vec::new();
    for name in strings(value, field)? {
        check_env_name(name).map_err(|message| invalid(field, message))?;
        if !names.iter().any(|seen| seen == name) {
            names.push(name.to_owned());
        }
    }
    Ok(names)
}

/// `items` kept to the names a session asked (`field`: `servers`), refusing
/// a name the profile does not have.
pub(crate) fn keep<T>(
    profile: &Profile,
    field: &str,
    items: &mut Vec<T>,
    asked: Option<&Vec<String>>,
    name: impl Fn(&T) -> &str,
) -> Result<(), PlanError> {
    let Some(names) = asked else {
        return Ok(());
    };
    let known: Vec<&str> = items.iter().map(&name).collect();
    if let Some(unknown) = names.iter().find(|asked| !known.contains(&asked.as_str())) {
        return Err(widening(
            &profile.name,
            field,
            format!("{unknown:?}"),
            list(&known),
        ));
    }
    items.retain(|item| names.iter().any(|asked| asked == name(item)));
    Ok(())
}

/// A profile with no workspace unit (`source = "none"`) has nothing for a
/// workspace field to narrow: the first the session asked (`fields`, in row
/// order) is refused, `mode` as the workspace's, the others as its unit's.
pub(crate) fn refuse_without_workspace(
    profile: &Profile,
    fields: &[&str],
) -> Result<(), PlanError> {
    if profile.workspace.source != Source::None {
        return Ok(());
    }
    match fields.first().copied() {
        None => Ok(()),
        Some("mode") => Err(invalid(
            "workspace.mode",
            format!("profile `{}` has no workspace to narrow", profile.name),
        )),
        Some(field) => Err(invalid(
            &format!("workspace.{field}"),
            format!("profile `{}` has no workspace unit", profile.name),
        )),
    }
}
