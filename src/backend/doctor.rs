//! `box doctor`: which protections this machine can give, measured here, and
//! which shipped profiles can run on which backend. Reads only: the engine's
//! version and info, /proc, the landlock ABI.

use serde_json::{Value, json};

use crate::backend::docker::DockerBackend;
use crate::plan::{HostFacts, NetworkMode, Requirement, UserIds};

/// A runc version against the CVE floors in security.md: ≥ 1.1.12
/// (CVE-2024-21626, leaked fd / working directory escape) and the 2025 fixes
/// (CVE-2025-31133, -52565, -52881: 1.2.8, 1.3.3, 1.4.0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuncFloor {
    /// At or above every floor.
    Ok,
    /// Below a floor; the sentence names which.
    Below(String),
    /// The version could not be parsed.
    Unknown,
}

/// Compare a runc version string (`1.1.5+ds1`, `v1.2.8`, `1.4.0-rc.3`) with the floors.
pub fn runc_floor(version: &str) -> RuncFloor {
    let numeric: String = version
        .trim_start_matches('v')
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let parts: Vec<u64> = numeric
        .split('.')
        .filter(|p| !p.is_empty())
        .filter_map(|p| p.parse().ok())
        .collect();
    let [major, minor, patch, ..] = parts.as_slice() else {
        return RuncFloor::Unknown;
    };
    // 1.4.0 carries the 2025 fixes from its third release candidate on.
    let rc: Option<u64> = version
        .split_once("-rc.")
        .and_then(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok());
    let v = (*major, *minor, *patch);
    let cve_2025 = "CVE-2025-31133/52565/52881 are fixed in 1.2.8, 1.3.3 and 1.4.0";
    if v < (1, 1, 12) {
        return RuncFloor::Below(format!("below 1.1.12 (CVE-2024-21626), and {cve_2025}"));
    }
    let ok = match (major, minor) {
        (0, _) => false,
        (1, 0..=1) => false,
        (1, 2) => *patch >= 8,
        (1, 3) => *patch >= 3,
        (1, 4) => *patch > 0 || rc.is_none_or(|n| n >= 3),
        _ => true,
    };
    if ok {
        RuncFloor::Ok
    } else {
        RuncFloor::Below(format!("below the 2025 floors: {cve_2025}"))
    }
}

/// Gather the report.
pub async fn report() -> Value {
    let kernel = kernel_facts();
    let landlock_abi = crate::backend::docker::landlock_abi();
    let (docker, backend) = match DockerBackend::connect().await {
        Ok(backend) => (docker_facts(&backend).await, Some(backend)),
        Err(error) => (
            json!({"available": false, "error": error.to_string()}),
            None,
        ),
    };
    let mut profiles = Vec::new();
    // Every profile this host would resolve (the shipped ones and the
    // operator's), each once: the one a session would get by that name.
    let catalog = crate::profile::Catalog::new(Vec::new());
    for listed in catalog.list().into_iter().filter(|listed| !listed.hidden) {
        profiles.push(profile_fit(&listed.name, backend.as_ref(), landlock_abi, &kernel).await);
    }
    json!({
        "docker": docker,
        "kernel": kernel,
        "profiles": profiles,
    })
}

async fn docker_facts(backend: &DockerBackend) -> Value {
    let facts = backend.facts();
    let version = backend.client().version().await.ok();
    let runc = version
        .and_then(|v| v.components)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.name.eq_ignore_ascii_case("runc"));
    let runc = match runc {
        Some(component) => {
            let commit = component
                .details
                .and_then(|d| d.get("GitCommit").cloned())
                .unwrap_or_default();
            let (floor, note) = match runc_floor(&component.version) {
                RuncFloor::Ok => ("ok", String::new()),
                RuncFloor::Below(why) => (
                    "below",
                    format!(
                        "{why}; a distribution build may carry the fixes as backports (build {commit}): check its changelog, or upgrade"
                    ),
                ),
                RuncFloor::Unknown => ("unknown", "could not parse the version".to_owned()),
            };
            json!({"version": component.version, "commit": commit, "floor": floor, "note": note})
        }
        None => {
            json!({"version": null, "floor": "unknown", "note": "the engine did not report runc"})
        }
    };
    let mut images = serde_json::Map::new();
    for image in ["box-base:bookworm", "box-rootfs:bookworm"] {
        let present = backend.client().inspect_image(image).await.is_ok();
        images.insert(image.to_owned(), Value::Bool(present));
    }
    json!({
        "available": true,
        "version": facts.version,
        "apiVersion": facts.api_version,
        "runc": runc,
        "cgroupVersion": facts.cgroup_version,
        "seccomp": facts.seccomp,
        "usernsRemap": facts.userns_remap,
        "images": images,
    })
}

fn read_trim(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
}

fn kernel_facts() -> Value {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let seccomp_field = status
        .lines()
        .find_map(|l| l.strip_prefix("Seccomp:"))
        .map(str::trim);
    let cgroup_version = if std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        "2"
    } else {
        "1"
    };
    let max_userns: Option<u64> =
        read_trim("/proc/sys/user/max_user_namespaces").and_then(|s| s.parse().ok());
    let unpriv_clone = read_trim("/proc/sys/kernel/unprivileged_userns_clone");
    let apparmor_userns = read_trim("/proc/sys/kernel/apparmor_restrict_unprivileged_userns");
    let user_namespaces = max_userns.is_some_and(|n| n > 0)
        && unpriv_clone.as_deref() != Some("0")
        && apparmor_userns.as_deref() != Some("1");
    json!({
        "release": read_trim("/proc/sys/kernel/osrelease"),
        "landlockAbi": crate::backend::docker::landlock_abi(),
        "seccomp": seccomp_field.is_some(),
        "seccompModeHere": seccomp_field,
        "cgroupVersion": cgroup_version,
        "userNamespaces": {
            "available": user_namespaces,
            "maxUserNamespaces": max_userns,
            "unprivilegedUsernsClone": unpriv_clone,
            "apparmorRestrictUnprivilegedUserns": apparmor_userns,
        },
    })
}

async fn profile_fit(
    name: &str,
    docker: Option<&DockerBackend>,
    landlock_abi: u32,
    kernel: &Value,
) -> Value {
    let catalog = crate::profile::Catalog::new(Vec::new());
    let profile = match catalog.load(name) {
        Ok(profile) => profile,
        Err(error) => return json!({"name": name, "error": error.to_string()}),
    };
    let host = HostFacts {
        cwd: std::env::current_dir().unwrap_or_else(|_| "/".into()),
        caller: UserIds {
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
        },
    };
    let plan = match crate::plan::resolve(&profile, &Value::Null, &host) {
        Ok(plan) => plan,
        Err(error) => return json!({"name": name, "error": error.to_string()}),
    };
    let mut on_docker: Vec<String> = Vec::new();
    let mut on_local: Vec<String> = Vec::new();
    let userns = kernel["userNamespaces"]["available"]
        .as_bool()
        .unwrap_or(false);
    for unit in &plan.units {
        match docker {
            None => on_docker.push("no Docker engine".to_owned()),
            Some(backend) => {
                if backend.client().inspect_image(&unit.image).await.is_err() {
                    on_docker.push(format!(
                        "unit {}: image {} missing (box image build)",
                        unit.name, unit.image
                    ));
                }
            }
        }
        match unit.network.mode {
            NetworkMode::Egress => {
                on_docker.push(format!(
                    "unit {}: no egress filter on the docker backend",
                    unit.name
                ));
                on_local.push(format!(
                    "unit {}: no egress filter on the local backend",
                    unit.name
                ));
            }
            NetworkMode::None | NetworkMode::Bridge => {}
        }
        if !unit.security.capabilities.is_empty() {
            on_local.push(format!(
                "unit {}: the local backend grants no capabilities back",
                unit.name
            ));
        }
        if unit.security.landlock == Requirement::Required && landlock_abi == 0 {
            on_docker.push(format!(
                "unit {}: landlock required, kernel has none",
                unit.name
            ));
            on_local.push(format!(
                "unit {}: landlock required, kernel has none",
                unit.name
            ));
        }
        match unit.network.mode {
            NetworkMode::None if !userns => on_local.push(format!(
                "unit {}: network none needs a network namespace (user namespaces unavailable)",
                unit.name
            )),
            NetworkMode::None | NetworkMode::Egress | NetworkMode::Bridge => {}
        }
    }
    on_docker.dedup();
    json!({
        "name": name,
        "docker": if on_docker.is_empty() { json!("yes") } else { json!(on_docker) },
        "local": if on_local.is_empty() { json!("yes") } else { json!(on_local) },
    })
}

/// The human form of the report.
pub fn render(report: &Value) -> String {
    let mut out = String::new();
    let docker = &report["docker"];
    if docker["available"].as_bool() == Some(true) {
        out.push_str(&format!(
            "docker        engine {} (API {}), cgroup v{}, seccomp {}, userns-remap {}\n",
            text(&docker["version"]),
            text(&docker["apiVersion"]),
            text(&docker["cgroupVersion"]),
            yes(&docker["seccomp"]),
            yes(&docker["usernsRemap"]),
        ));
        let runc = &docker["runc"];
        out.push_str(&format!(
            "runc          {} ({}){}\n",
            text(&runc["version"]),
            text(&runc["floor"]),
            match runc["note"].as_str() {
                Some(note) if !note.is_empty() => format!(": {note}"),
                _ => String::new(),
            }
        ));
        if let Some(images) = docker["images"].as_object() {
            for (image, present) in images {
                out.push_str(&format!(
                    "image         {image}: {}\n",
                    if present.as_bool() == Some(true) {
                        "present"
                    } else {
                        "missing (box image build)"
                    }
                ));
            }
        }
    } else {
        out.push_str(&format!(
            "docker        unavailable: {}\n",
            text(&docker["error"])
        ));
    }
    let kernel = &report["kernel"];
    out.push_str(&format!(
        "kernel        {}, cgroup v{}, seccomp {}, landlock ABI {}, user namespaces {}\n",
        text(&kernel["release"]),
        text(&kernel["cgroupVersion"]),
        yes(&kernel["seccomp"]),
        text(&kernel["landlockAbi"]),
        yes(&kernel["userNamespaces"]["available"]),
    ));
    for profile in report["profiles"].as_array().into_iter().flatten() {
        let fit = |v: &Value| match v {
            Value::String(s) => s.clone(),
            Value::Array(why) => format!(
                "no ({})",
                why.iter().map(text).collect::<Vec<_>>().join("; ")
            ),
            _ => "?".to_owned(),
        };
        if let Some(error) = profile["error"].as_str() {
            out.push_str(&format!(
                "profile       {}: {error}\n",
                text(&profile["name"])
            ));
        } else {
            out.push_str(&format!(
                "profile       {}: docker {}, local {}\n",
                text(&profile["name"]),
                fit(&profile["docker"]),
                fit(&profile["local"]),
            ));
        }
    }
    out
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "?".to_owned(),
        other => other.to_string(),
    }
}

fn yes(v: &Value) -> &'static str {
    if v.as_bool() == Some(true) {
        "yes"
    } else {
        "no"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runc_versions_against_the_floors() {
        for (version, ok) in [
            ("1.1.5+ds1", false),
            ("1.1.12", false),
            ("1.2.7", false),
            ("1.2.8", true),
            ("v1.3.3", true),
            ("1.3.2", false),
            ("1.4.0-rc.2", false),
            ("1.4.0-rc.3", true),
            ("1.4.0", true),
            ("1.5.1", true),
        ] {
            assert_eq!(runc_floor(version) == RuncFloor::Ok, ok, "{version}");
        }
        assert_eq!(runc_floor("weird"), RuncFloor::Unknown);
        assert!(
            matches!(runc_floor("1.1.5"), RuncFloor::Below(why) if why.contains("CVE-2024-21626"))
        );
    }
}
