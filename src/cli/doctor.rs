//! `box doctor`: which protections this machine can give, measured here, and
//! which shipped profiles can run on which backend. Reads only: the engine's
//! version and info, /proc, the landlock ABI.

use serde_json::{Value, json};

use std::path::PathBuf;
use std::process::ExitCode;

use std::sync::Arc;

use box_backend::{Backend, BackendKind};
use box_backend_docker::DockerBackend;

use crate::plan::HostFacts;
use crate::profile::Catalog;

/// `box doctor`.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = "Examples:
  box doctor
  box doctor --json
  box doctor --strict && box serve
  box doctor --profiles ./profiles --strict --profile mine
  box doctor --workspace ~/src/project --json
  box doctor --host http://127.0.0.1:8080 --token-file token

--strict: the profile (--profile, default `default`) must be able to run here
on at least one backend with every protection it requires, as that backend's
own start-time check judges it (docker: an engine, the profile's images,
landlock when the profile requires it; local: user namespaces, landlock when
required, what the local sandbox cannot apply refused: an image, unless the
unit says local_userland = \"host\", and a runtime); else box doctor exits 1
naming what is missing on each backend.")]
pub struct DoctorArgs {
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
    /// More directories of profiles, searched first (repeatable): judged
    /// with the others.
    #[arg(long = "profiles", value_name = "DIR")]
    pub profile_dirs: Vec<PathBuf>,
    /// The host directory a `cwd` workspace source means; default the
    /// current directory (as `box serve` and `box run` take it).
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// Exit 1 when no backend here can give --profile every protection it requires.
    #[arg(long)]
    pub strict: bool,
    /// The profile --strict judges.
    #[arg(
        long,
        value_name = "NAME",
        default_value = "default",
        requires = "strict",
        add = clap_complete::ArgValueCandidates::new(crate::cli::complete::profile_names)
    )]
    pub profile: String,
    /// Also ask a running `box serve --listen` at this URL how it is: ready
    /// or not and why, and each pool's ready units against its size (its
    /// /readyz and /metrics). With --strict, a host that is not ready fails.
    #[arg(long, value_name = "URL", env = "BOX_HOST")]
    pub host: Option<String>,
    /// With --host: a file holding the bearer token the host asks of its
    /// clients (its --token-file; /metrics and the reason a host is not
    /// ready are told only with it).
    #[arg(long, value_name = "FILE", env = "BOX_TOKEN_FILE", requires = "host")]
    pub token_file: Option<PathBuf>,
}

/// Run `box doctor`.
pub fn doctor(args: DoctorArgs) -> anyhow::Result<ExitCode> {
    let catalog = crate::cli::catalog(&args.profile_dirs)?;
    let host = match &args.workspace {
        Some(_) => crate::host::host_facts(args.workspace.as_ref())?,
        // A report still comes from a directory that was removed under us.
        None => crate::host::host_facts(None).unwrap_or_else(|_| here()),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let token = match &args.token_file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .map_err(|error| anyhow::anyhow!("--token-file {}: {error}", path.display()))?
                .trim()
                .to_owned(),
        ),
        None => None,
    };
    let mut report = runtime.block_on(report(&catalog, &host));
    if let Some(url) = &args.host {
        report["host"] = runtime.block_on(running_host(url, token));
    }
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        out!("{}", render(&report));
    }
    if args.strict
        && let Some(why) = report["host"]["notReady"].as_str()
    {
        eprintln!("box doctor --strict: the host is not ready: {why}");
        return Ok(ExitCode::FAILURE);
    }
    if args.strict
        && let Err(why) = strict(&report, &args.profile)
    {
        eprintln!("box doctor --strict: {why}");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether profile `name` can run here with every protection it requires:
/// on at least one backend, per the report's own judgement of it.
pub fn strict(report: &Value, name: &str) -> Result<(), String> {
    let Some(profile) = report["profiles"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|profile| profile["name"].as_str() == Some(name))
    else {
        return Err(format!(
            "--profile {name}: no such profile among those box finds (box profile list)"
        ));
    };
    if let Some(error) = profile["error"].as_str() {
        return Err(format!("profile {name}: {error}"));
    }
    let fits = fits(profile);
    if fits.iter().any(|(_, fit)| fit.as_str() == Some("yes")) {
        return Ok(());
    }
    let why: Vec<String> = fits
        .iter()
        .map(|(backend, fit)| {
            let why = fit
                .as_array()
                .map(|why| why.iter().map(text).collect::<Vec<_>>().join("; "))
                .unwrap_or_else(|| "?".to_owned());
            format!("{backend}: {why}")
        })
        .collect();
    Err(format!(
        "profile {name} cannot run here with the protections it requires: {}",
        why.join("; ")
    ))
}

/// A profile's fit on each backend the report judged it on (every key but
/// its name and error: one per registered backend), by name.
fn fits(profile: &Value) -> Vec<(&str, &Value)> {
    profile
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(key, _)| !matches!(key.as_str(), "name" | "error"))
        .map(|(key, fit)| (key.as_str(), fit))
        .collect()
}

/// Gather the report: the machine's facts, and how each profile in
/// `catalog` fits here, resolved with `host`'s directory and ids.
pub async fn report(catalog: &Catalog, host: &HostFacts) -> Value {
    let kernel = kernel_facts();
    // The engine's own facts (its part of `box doctor`).
    let docker = match DockerBackend::connect().await {
        Ok(backend) => box_backend_docker::doctor::doctor_facts(&backend).await,
        Err(error) => json!({"available": false, "error": error.to_string()}),
    };
    // Every registered backend, connected once, judges every profile.
    let registry = crate::backends::registry();
    let mut backends = Vec::new();
    for kind in registry.kinds() {
        backends.push((kind, registry.connect(kind.as_str()).await));
    }
    let mut profiles = Vec::new();
    // Every profile this host would resolve (the shipped ones and the
    // operator's), each once: the one a session would get by that name.
    for listed in catalog.list().into_iter().filter(|listed| !listed.hidden) {
        profiles.push(profile_fit(catalog, host, &listed.name, &backends).await);
    }
    let local = local_facts(&kernel);
    json!({
        "docker": docker,
        "kernel": kernel,
        "local": local,
        "user": unit_user(host),
        "profiles": profiles,
    })
}

/// How a running host is: `/readyz` (ready, or why not) and, from
/// `/metrics`, each pool's ready units against its size.
async fn running_host(url: &str, token: Option<String>) -> Value {
    use box_transport::client::{HostClient, HostUrl};
    let parsed = match HostUrl::parse(url) {
        Ok(parsed) => parsed,
        Err(why) => return json!({"url": url, "notReady": format!("--host {why}")}),
    };
    let endpoint = parsed.at("");
    let client = HostClient::new(parsed, token);
    let mut host = json!({"url": endpoint});
    match client.get("/readyz").await {
        Ok((200, _)) => host["ready"] = json!(true),
        Ok((status, text)) => {
            host["ready"] = json!(false);
            host["notReady"] = json!(format!(
                "{endpoint}/readyz answers {status}: {}",
                text.trim()
            ));
        }
        Err(error) => {
            host["ready"] = json!(false);
            host["notReady"] = json!(error.to_string());
            return host;
        }
    }
    match client.get("/metrics").await {
        Ok((200, text)) => host["pools"] = json!(pools_of_metrics(&text)),
        Ok((401, _)) => {
            host["pools"] =
                json!("not told: /metrics asks for the host's bearer token (--token-file)")
        }
        Ok((status, _)) => host["pools"] = json!(format!("not told: /metrics answers {status}")),
        Err(error) => host["pools"] = json!(format!("not told: {error}")),
    }
    host
}

/// Each pool's `{profile, ready, size}` from the host's `box_pool_ready` and
/// `box_pool_size` gauges.
fn pools_of_metrics(text: &str) -> Vec<Value> {
    let mut pools: Vec<Value> = Vec::new();
    for line in text.lines() {
        let (key, rest) = if let Some(rest) = line.strip_prefix("box_pool_ready{") {
            ("ready", rest)
        } else if let Some(rest) = line.strip_prefix("box_pool_size{") {
            ("size", rest)
        } else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let Some(profile) = labels
            .split(',')
            .find_map(|label| label.strip_prefix("profile=\""))
            .map(|profile| profile.trim_end_matches('"'))
        else {
            continue;
        };
        let value: u64 = value.trim().parse().unwrap_or(0);
        match pools.iter_mut().find(|pool| pool["profile"] == profile) {
            Some(pool) => pool[key] = json!(value),
            None => pools.push(json!({"profile": profile, key: value})),
        }
    }
    pools
}

/// What a local unit's egress and secrets rest on, from the kernel's facts:
/// both need namespaces of the unit's own (a start without them is refused),
/// and egress limits TCP to the bridge's port where landlock has ABI 4.
fn local_facts(kernel: &Value) -> Value {
    let namespaces = kernel["userNamespaces"]["available"].as_bool() == Some(true)
        || nix::unistd::geteuid().is_root();
    let tcp_ports = kernel["landlockAbi"].as_u64().unwrap_or(0) >= 4;
    json!({
        "egress": {
            "networkNamespace": if namespaces { "needed, can be made here" } else { "needed, and no user namespaces here: egress units are refused" },
            "landlockTcpPorts": if tcp_ports { json!([box_backend::EgressWiring::BRIDGE_PORT]) } else { json!("landlock ABI below 4: TCP not limited to the bridge's port (the namespace with only lo is the boundary)") },
        },
        "secrets": if namespaces { "files on a tmpfs in the unit's own mount namespace" } else { "refused: no user namespaces here for a mount namespace of the unit's own" },
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
        "landlockAbi": box_confine::landlock_abi(),
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

/// The host facts a session started here would get: this directory, this
/// process's ids, and the directory's owner.
fn here() -> HostFacts {
    let cwd = std::env::current_dir().unwrap_or_else(|_| "/".into());
    HostFacts {
        workspace_owner: crate::host::owner_of(&cwd),
        cwd,
        caller: crate::plan::UserIds {
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
        },
    }
}

/// Who a `user = "host"` unit started here runs as, and, when that is uid
/// 0, the warning and its remedies (issue 23: no uid 0 by surprise).
pub fn unit_user(facts: &HostFacts) -> Value {
    let user = facts.host_user();
    let mut shown = json!({
        "caller": format!("{}:{}", facts.caller.uid, facts.caller.gid),
        "workspace": facts.cwd.display().to_string(),
        "workspaceOwner": facts.workspace_owner.map(|owner| format!("{}:{}", owner.uid, owner.gid)),
        "unitUser": format!("{}:{}", user.uid, user.gid),
    });
    if user.uid == 0 {
        let root = box_policy::envelope::RootUser::new();
        shown["rootUser"] = json!({"warning": root.warning, "remedies": root.remedies});
    }
    shown
}

/// A registered backend, connected, or why it could not be.
type Connected = Result<Arc<dyn Backend>, String>;

/// Whether each registered backend can run profile `name` here: the
/// backend's own [`Backend::check`], the one judgement a start makes too,
/// plus what its engine would be missing ([`Backend::ready`]: docker's
/// images). A backend that does not connect says why, once.
async fn profile_fit(
    catalog: &Catalog,
    host: &HostFacts,
    name: &str,
    backends: &[(BackendKind, Connected)],
) -> Value {
    let profile = match catalog.load(name) {
        Ok(profile) => profile,
        Err(error) => return json!({"name": name, "error": error.to_string()}),
    };
    let plan = match crate::host::resolve_plan(&profile, &Value::Null, host) {
        Ok(plan) => plan,
        Err(error) => return json!({"name": name, "error": error.to_string()}),
    };
    let mut fit = json!({"name": name});
    for (kind, backend) in backends {
        let mut why: Vec<String> = Vec::new();
        match backend {
            Err(error) => why.push(error.clone()),
            Ok(backend) => {
                for unit in &plan.units {
                    if let Err(missing) = backend.ready(unit).await {
                        why.extend(missing);
                    }
                    if let Err(refusals) = backend.check(unit) {
                        why.extend(refusals.iter().map(ToString::to_string));
                    }
                }
            }
        }
        why.dedup();
        fit[kind.as_str()] = if why.is_empty() {
            json!("yes")
        } else {
            json!(why)
        };
    }
    fit
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
        if let Some(runtimes) = docker["runtimes"].as_object() {
            let names: Vec<&str> = runtimes.keys().map(String::as_str).collect();
            out.push_str(&format!(
                "runtimes      {} (a unit picks one with runtime = \"NAME\")\n",
                names.join(", ")
            ));
        }
        if let Some(note) = docker["runsc"]["note"].as_str() {
            out.push_str(&format!("gvisor        {note}\n"));
        }
        if let Some(images) = docker["images"].as_object() {
            for (image, present) in images {
                out.push_str(&format!(
                    "image         {image}: {}\n",
                    if present.as_bool() == Some(true) {
                        "present".to_owned()
                    } else {
                        format!(
                            "missing ({})",
                            box_backend_docker::missing_image_remedy(
                                image,
                                crate::plan::PullPolicy::Missing
                            )
                        )
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
    let local = &report["local"];
    if local.is_object() {
        let ports = match &local["egress"]["landlockTcpPorts"] {
            Value::Array(ports) => format!(
                "landlock TCP only to port {}",
                ports.iter().map(text).collect::<Vec<_>>().join(", ")
            ),
            other => text(other),
        };
        out.push_str(&format!(
            "local         egress: a network namespace of its own with only lo ({}), {ports}; secrets: {}\n",
            text(&local["egress"]["networkNamespace"]),
            text(&local["secrets"]),
        ));
    }
    let user = &report["user"];
    if user.is_object() {
        out.push_str(&format!(
            "user          units of user = \"host\" profiles run as {} here (caller {}, {} owned by {})\n",
            text(&user["unitUser"]),
            text(&user["caller"]),
            text(&user["workspace"]),
            text(&user["workspaceOwner"]),
        ));
        if let Some(warning) = user["rootUser"]["warning"].as_str() {
            out.push_str(&format!("WARNING       {warning}\n"));
            for remedy in user["rootUser"]["remedies"]
                .as_array()
                .into_iter()
                .flatten()
            {
                out.push_str(&format!("  remedy      {}\n", text(remedy)));
            }
        }
    }
    let host = &report["host"];
    if host.is_object() {
        match host["notReady"].as_str() {
            None => out.push_str(&format!("host          {}: ready\n", text(&host["url"]))),
            Some(why) => out.push_str(&format!(
                "host          {}: NOT READY: {why}\n",
                text(&host["url"])
            )),
        }
        match &host["pools"] {
            Value::Array(pools) if pools.is_empty() => {
                out.push_str(
                    "pools         none kept (box serve --pool PROFILE=N, or a profile's [pool])\n",
                );
            }
            Value::Array(pools) => {
                for pool in pools {
                    let ready = pool["ready"].as_u64().unwrap_or(0);
                    let size = pool["size"].as_u64().unwrap_or(0);
                    out.push_str(&format!(
                        "pool          {}: {ready} of {size} ready{}\n",
                        text(&pool["profile"]),
                        if ready < size {
                            " (refilling, or failing: see /readyz)"
                        } else {
                            ""
                        }
                    ));
                }
            }
            Value::String(why) => out.push_str(&format!("pools         {why}\n")),
            _ => {}
        }
    }
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
            let fits: Vec<String> = fits(profile)
                .into_iter()
                .map(|(backend, judged)| format!("{backend} {}", fit(judged)))
                .collect();
            out.push_str(&format!(
                "profile       {}: {}\n",
                text(&profile["name"]),
                fits.join(", ")
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
    fn strict_needs_one_backend_with_every_protection() {
        let report = |docker: Value, local: Value| json!({"profiles": [{"name": "default", "docker": docker, "local": local}]});
        assert_eq!(
            strict(&report(json!("yes"), json!(["x"])), "default"),
            Ok(())
        );
        assert_eq!(
            strict(&report(json!(["x"]), json!("yes")), "default"),
            Ok(())
        );
        let error = strict(
            &report(
                json!(["no Docker engine"]),
                json!(["workspace: landlock: the host kernel offers no landlock ABI"]),
            ),
            "default",
        )
        .unwrap_err();
        assert_eq!(
            error,
            "profile default cannot run here with the protections it requires: docker: no Docker engine; local: workspace: landlock: the host kernel offers no landlock ABI"
        );
        let error =
            strict(&json!({"profiles": [{"name": "ci", "error": "bad"}]}), "ci").unwrap_err();
        assert_eq!(error, "profile ci: bad");
    }
}
