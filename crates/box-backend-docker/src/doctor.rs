//! The engine's part of `box doctor`.

use serde_json::{Value, json};

use crate::DockerBackend;
use crate::runc::{RuncFloor, runc_floor};

/// What `box doctor` reports of the engine: version, runc against the
/// floors, cgroups, seccomp, userns-remap, and whether box's images are there.
pub async fn doctor_facts(backend: &DockerBackend) -> Value {
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
    // gVisor installed but not registered is worth a line: the fix is one script.
    let runsc_installed = ["/usr/bin/runsc", "/usr/sbin/runsc", "/usr/local/bin/runsc"]
        .into_iter()
        .find(|path| std::path::Path::new(path).exists());
    let gvisor_registered = facts
        .runtimes
        .keys()
        .any(|runtime| facts.is_gvisor(runtime));
    let runsc = match (runsc_installed, gvisor_registered) {
        (_, true) => json!({"registered": true}),
        (Some(path), false) => json!({
            "registered": false,
            "installed": path,
            "note": format!("{path} is installed but not registered with the engine: run scripts/runsc.sh (adds it to /etc/docker/daemon.json with --network=none --host-uds=open and reloads dockerd); see docs/gvisor.md"),
        }),
        (None, false) => json!({"registered": false, "installed": null}),
    };
    json!({
        "available": true,
        "runtimes": facts.runtimes,
        "runsc": runsc,
        "version": facts.version,
        "apiVersion": facts.api_version,
        "runc": runc,
        "cgroupVersion": facts.cgroup_version,
        "seccomp": facts.seccomp,
        "usernsRemap": facts.userns_remap,
        "images": images,
    })
}
