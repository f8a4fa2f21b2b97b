//! Tightening and resolution: every narrowing rule in both directions, the
//! properties (monotone, idempotent, never wider, deterministic), and golden
//! plans of the shipped profiles.

use std::path::PathBuf;

use pretty_assertions::assert_eq;
use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::profile::Catalog;

/// A profile written in TOML (as `p.toml`), loaded through the catalog.
fn profile(text: &str) -> Profile {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.toml"), text).unwrap();
    Catalog::only(vec![dir.path().to_path_buf()])
        .load("p")
        .unwrap()
}

const EGRESS: &str = r#"
description = "egress"
[workspace]
mode = "rw"
[network]
mode = "egress"
allow = ["example.com:443", "api.example.com"]
[limits]
memory = "2GiB"
cpus = 2
pids = 512
tmp = "256MiB"
nofile = 4096
call_timeout = "10m"
idle = "30m"
lifetime = "8h"
[env]
set = { CI = "true", MODE = "x" }
pass = ["LANG", "TERM"]
secrets = ["GITHUB_TOKEN"]
[[server]]
name = "one"
image = "one:1"
command = ["one"]
[[server]]
name = "two"
image = "two:1"
command = ["two"]
"#;

fn resolve_json(profile: &Profile, tighten: Value) -> Result<Plan, String> {
    resolve(profile, &tighten, &HostFacts::fixed()).map_err(|error| error.to_string())
}

#[test]
fn an_empty_tightening_changes_nothing() {
    let profile = profile(EGRESS);
    let untightened = resolve_json(&profile, Value::Null).unwrap();
    assert_eq!(resolve_json(&profile, json!({})).unwrap(), untightened);
    let workspace = untightened.workspace().unwrap();
    assert_eq!(
        workspace.source,
        WorkspaceSource::Host(PathBuf::from("/home/user/project"))
    );
    assert_eq!(
        workspace.user,
        Some(UserIds {
            uid: 1000,
            gid: 1000
        })
    );
    assert_eq!(untightened.servers().count(), 2);
}

/// Every limit: narrower accepted, equal accepted, wider refused with the exact message.
#[test]
fn limits_narrow_only() {
    let profile = profile(EGRESS);
    let cases: &[(&str, Value, Value, Value, &str)] = &[
        (
            "memory",
            json!("1GiB"),
            json!("2GiB"),
            json!("4GiB"),
            "tighten.limits.memory: asked for 4GiB, but profile `p` allows at most 2GiB",
        ),
        (
            "cpus",
            json!(0.5),
            json!(2),
            json!(2.5),
            "tighten.limits.cpus: asked for 2.5, but profile `p` allows at most 2",
        ),
        (
            "pids",
            json!(100),
            json!(512),
            json!(513),
            "tighten.limits.pids: asked for 513, but profile `p` allows at most 512",
        ),
        (
            "tmp",
            json!("64MiB"),
            json!("256MiB"),
            json!("257MiB"),
            "tighten.limits.tmp: asked for 257MiB, but profile `p` allows at most 256MiB",
        ),
        (
            "nofile",
            json!(1024),
            json!(4096),
            json!(65536),
            "tighten.limits.nofile: asked for 65536, but profile `p` allows at most 4096",
        ),
        (
            "call_timeout",
            json!("1m"),
            json!("10m"),
            json!("11m"),
            "tighten.limits.call_timeout: asked for 11m, but profile `p` allows at most 10m",
        ),
        (
            "idle",
            json!("5m"),
            json!("30m"),
            json!("1h"),
            "tighten.limits.idle: asked for 1h, but profile `p` allows at most 30m",
        ),
        (
            "lifetime",
            json!("1h"),
            json!("8h"),
            json!("1day"),
            "tighten.limits.lifetime: asked for 1day, but profile `p` allows at most 8h",
        ),
        (
            "start_timeout",
            json!("10s"),
            json!("1m"),
            json!("2m"),
            "tighten.limits.start_timeout: asked for 2m, but profile `p` allows at most 1m",
        ),
    ];
    for (field, narrower, equal, wider, message) in cases {
        for ok in [narrower, equal] {
            let plan = resolve_json(&profile, json!({"limits": {*field: ok}}));
            assert!(plan.is_ok(), "{field} = {ok}: {plan:?}");
        }
        assert_eq!(
            resolve_json(&profile, json!({"limits": {*field: wider}})).unwrap_err(),
            *message
        );
    }
    let plan = resolve_json(
        &profile,
        json!({"limits": {"memory": "1GiB", "cpus": 0.5, "pids": 100}}),
    )
    .unwrap();
    let limits = &plan.workspace().unwrap().limits;
    assert_eq!(
        (limits.memory_bytes, limits.cpus, limits.pids),
        (1 << 30, 0.5, 100)
    );
}

#[test]
fn workspace_mode_narrows_only() {
    let rw = profile(EGRESS);
    assert_eq!(
        resolve_json(&rw, json!({"workspace": {"mode": "ro"}}))
            .unwrap()
            .workspace()
            .unwrap()
            .mode,
        MountMode::ReadOnly
    );
    assert_eq!(
        resolve_json(&rw, json!({"workspace": {"mode": "rw"}}))
            .unwrap()
            .workspace()
            .unwrap()
            .mode,
        MountMode::ReadWrite
    );
    let ro = profile("description = \"x\"\n[workspace]\nmode = \"ro\"\n");
    assert!(resolve_json(&ro, json!({"workspace": {"mode": "ro"}})).is_ok());
    assert_eq!(
        resolve_json(&ro, json!({"workspace": {"mode": "rw"}})).unwrap_err(),
        "tighten.workspace.mode: asked for \"rw\", but profile `p` allows at most \"ro\""
    );
}

#[test]
fn network_narrows_only() {
    let egress = profile(EGRESS);
    let none = profile("description = \"x\"\n");
    let bridge = profile("description = \"x\"\n[network]\nmode = \"bridge\"\n");
    let network = |profile: &Profile, ask: Value| {
        resolve_json(profile, json!({"network": ask}))
            .map(|plan| plan.workspace().unwrap().network.clone())
    };
    // Narrower and equal.
    assert_eq!(
        network(&egress, json!({"mode": "none"})).unwrap(),
        Network::none()
    );
    assert_eq!(
        network(&egress, json!({"mode": "egress"})).unwrap().allow,
        vec!["example.com:443", "api.example.com"]
    );
    assert_eq!(
        network(&egress, json!({"allow": ["example.com:443"]}))
            .unwrap()
            .allow,
        vec!["example.com:443"]
    );
    assert_eq!(
        network(&egress, json!({"allow": ["api.example.com:80"]}))
            .unwrap()
            .allow,
        vec!["api.example.com:80"]
    );
    // Narrowing is set inclusion, port by port (as the proxy narrows a running
    // unit): a bare host is within a list that allows its two ports apart.
    let ports_apart = profile(
        "description = \"x\"\n[network]\nmode = \"egress\"\nallow = [\"example.com:443\", \"example.com:80\"]\n",
    );
    assert_eq!(
        network(&ports_apart, json!({"allow": ["example.com"]}))
            .unwrap()
            .allow,
        vec!["example.com"]
    );
    assert!(network(&ports_apart, json!({"allow": ["example.com:8080"]})).is_err());
    // A bare host is ports 80 and 443, so another port is wider.
    assert_eq!(
        network(&egress, json!({"allow": ["api.example.com:8443"]})).unwrap_err(),
        "tighten.network.allow: asked for \"api.example.com:8443\", but profile `p` allows at most [example.com:443, api.example.com]"
    );
    assert_eq!(
        network(
            &bridge,
            json!({"mode": "egress", "allow": ["anything.org"]})
        )
        .unwrap()
        .mode,
        NetworkMode::Egress
    );
    assert_eq!(
        network(&bridge, json!({"mode": "bridge"})).unwrap().mode,
        NetworkMode::Bridge
    );
    assert_eq!(
        network(&none, json!({"mode": "none"})).unwrap().mode,
        NetworkMode::None
    );
    // Wider.
    assert_eq!(
        network(&none, json!({"mode": "bridge"})).unwrap_err(),
        "tighten.network.mode: asked for \"bridge\", but profile `p` allows at most \"none\""
    );
    assert_eq!(
        network(&none, json!({"mode": "egress", "allow": ["example.com"]})).unwrap_err(),
        "tighten.network.mode: asked for \"egress\", but profile `p` allows at most \"none\""
    );
    assert_eq!(
        network(&egress, json!({"mode": "bridge"})).unwrap_err(),
        "tighten.network.mode: asked for \"bridge\", but profile `p` allows at most \"egress\""
    );
    assert_eq!(
        network(&egress, json!({"allow": ["evil.com:443"]})).unwrap_err(),
        "tighten.network.allow: asked for \"evil.com:443\", but profile `p` allows at most [example.com:443, api.example.com]"
    );
    assert_eq!(
        network(&egress, json!({"allow": ["example.com"]})).unwrap_err(),
        "tighten.network.allow: asked for \"example.com\", but profile `p` allows at most [example.com:443, api.example.com]"
    );
    assert_eq!(
        network(&egress, json!({"allow": ["example.com:80"]})).unwrap_err(),
        "tighten.network.allow: asked for \"example.com:80\", but profile `p` allows at most [example.com:443, api.example.com]"
    );
    // Malformed.
    assert_eq!(
        network(&none, json!({"allow": ["example.com"]})).unwrap_err(),
        "tighten: network.allow: an allow list only applies to mode \"egress\", but the mode is \"none\""
    );
    assert_eq!(
        network(&egress, json!({"allow": []})).unwrap_err(),
        "tighten: network.allow: an empty allow list reaches nothing; ask mode \"none\" instead"
    );
    assert_eq!(
        network(&bridge, json!({"mode": "egress"})).unwrap_err(),
        "tighten: network.allow: mode \"egress\" needs an allow list of host[:port] entries"
    );
    assert_eq!(
        network(&egress, json!({"allow": ["http://example.com"]})).unwrap_err(),
        "tighten: network.allow: allow entry \"http://example.com\" has a scheme; write only the host; write host, *.suffix or host:port, like \"example.com\" (ports 80 and 443), \"*.example.com\" or \"example.com:8443\""
    );
}

#[test]
fn servers_narrow_to_a_subset() {
    let profile = profile(EGRESS);
    let names = |ask: Value| {
        resolve_json(&profile, json!({"servers": ask})).map(|plan| {
            plan.servers()
                .map(|unit| unit.name.clone())
                .collect::<Vec<_>>()
        })
    };
    assert_eq!(names(json!(["two"])).unwrap(), vec!["two"]);
    assert_eq!(names(json!(["two", "one"])).unwrap(), vec!["one", "two"]);
    assert_eq!(names(json!([])).unwrap(), Vec::<String>::new());
    assert_eq!(
        names(json!(["three"])).unwrap_err(),
        "tighten.servers: asked for \"three\", but profile `p` allows at most [one, two]"
    );
}

#[test]
fn env_drops_only() {
    let profile = profile(EGRESS);
    let plan = resolve_json(
        &profile,
        json!({"env": {"drop": ["CI", "LANG", "GITHUB_TOKEN", "NOT_THERE"]}}),
    )
    .unwrap();
    let workspace = plan.workspace().unwrap();
    assert_eq!(workspace.env_set.keys().collect::<Vec<_>>(), vec!["MODE"]);
    assert_eq!(workspace.env_pass, vec!["TERM"]);
    assert!(workspace.env_secrets.is_empty());
    // Adding is not a tightening (A8): the profile's own field is refused as one.
    assert_eq!(
        resolve_json(
            &profile,
            json!({"env": {"pass": ["AWS_SECRET_ACCESS_KEY"]}})
        )
        .unwrap_err(),
        "tighten: env.pass: a profile's field, which a session cannot tighten (a profile that extends this one can set it); a session tightens here: drop"
    );
    assert_eq!(
        resolve_json(&profile, json!({"env": {"drop": ["1X"]}})).unwrap_err(),
        "tighten: env.drop: \"1X\" is not a variable name; use letters, digits and _, not starting with a digit"
    );
}

/// Hostile tightenings (security.md A1, A2, A4–A9): each one precise error, nothing applied.
#[test]
fn hostile_tightenings_are_refused() {
    let offline = Catalog::only(Vec::new()).load("offline").unwrap();
    let cases: &[(Value, &str)] = &[
        (
            json!({"mounts": [{"source": "/var/run/docker.sock"}]}),
            "tighten: mounts: unknown field; accepted here: workspace, network, limits, env, servers, volumes",
        ),
        (
            json!({"workspace": {"source": "/"}}),
            "tighten: workspace.source: a profile's field, which a session cannot tighten (a profile that extends this one can set it); a session tightens here: image, mode, local_userland",
        ),
        (
            json!({"workspace": {"mode": "rw"}}),
            "tighten.workspace.mode: asked for \"rw\", but profile `offline` allows at most \"ro\"",
        ),
        (
            json!({"network": {"mode": "bridge"}}),
            "tighten.network.mode: asked for \"bridge\", but profile `offline` allows at most \"none\"",
        ),
        (
            json!({"limits": {"memory": "64GiB"}}),
            "tighten.limits.memory: asked for 64GiB, but profile `offline` allows at most 2GiB",
        ),
        (
            json!({"privileged": true}),
            "tighten: privileged: unknown field; accepted here: workspace, network, limits, env, servers, volumes",
        ),
        (
            json!({"security": {"cap_add": ["SYS_ADMIN"]}}),
            "tighten: security: a profile's field, which a session cannot tighten (a profile that extends this one can set it); a session tightens here: workspace, network, limits, env, servers, volumes",
        ),
        (
            json!({"pool": {"size": 0}}),
            "tighten: pool: a profile's field, which a session cannot tighten (a profile that extends this one can set it); a session tightens here: workspace, network, limits, env, servers, volumes",
        ),
        (
            json!({"devices": ["/dev/kvm"]}),
            "tighten: devices: unknown field; accepted here: workspace, network, limits, env, servers, volumes",
        ),
        (
            json!({"workspace": {"image": "evil:latest"}}),
            "tighten.workspace.image: asked for \"evil:latest\", but profile `offline` allows at most [\"box-base:bookworm\"] (its image and images)",
        ),
        (
            json!({"image": "evil:latest"}),
            "tighten: image: unknown field; a session chooses the workspace unit's image as workspace.image, from the profile's image and images",
        ),
        (
            json!({"env": {"set": {"LD_PRELOAD": "/x.so"}}}),
            "tighten: env.set: a profile's field, which a session cannot tighten (a profile that extends this one can set it); a session tightens here: drop",
        ),
        (
            json!([{"network": {"mode": "none"}}]),
            "tighten: expected an object with fields workspace, network, limits, env, servers, volumes, got an array",
        ),
        (
            json!("none"),
            "tighten: expected an object with fields workspace, network, limits, env, servers, volumes, got a string",
        ),
        (
            json!({"limits": {"memory": 2147483648_u64}}),
            "tighten: limits.memory: expected a string, got a number",
        ),
        (
            json!({"limits": {"memory": "2 gigs"}}),
            "tighten: limits.memory: \"2 gigs\" is not a size; write a whole number and a unit (B, KiB, MiB, GiB or TiB), like \"2GiB\"",
        ),
        (
            json!({"limits": {"pids": -1}}),
            "tighten: limits.pids: expected a whole number from 1, got -1",
        ),
        (
            json!({"limits": {"pids": 0}}),
            "tighten: limits.pids: 0 is not more than zero",
        ),
        (
            json!({"limits": {"cpus": 0}}),
            "tighten: limits.cpus: 0 is not a CPU quota; write a number of cores more than zero, like 2 or 0.5",
        ),
        (
            json!({"limits": {"swap": "1GiB"}}),
            "tighten: limits.swap: unknown field; accepted here: memory, cpus, pids, tmp, home, nofile, call_timeout, idle, lifetime, start_timeout",
        ),
        (
            json!({"limits": [[[[]]]]}),
            "tighten: limits: expected an object with fields memory, cpus, pids, tmp, home, nofile, call_timeout, idle, lifetime, start_timeout, got an array",
        ),
        (
            json!({"servers": "all"}),
            "tighten: servers: expected an array of strings, got a string",
        ),
        (
            json!({"workspace": {"user": "root"}}),
            "tighten: workspace.user: a profile's field, which a session cannot tighten (a profile that extends this one can set it); a session tightens here: image, mode, local_userland",
        ),
        (
            json!({"network": {"max_connections": 4}}),
            "tighten: network.max_connections: a profile's field, which a session cannot tighten (a profile that extends this one can set it); a session tightens here: mode, allow",
        ),
        (
            json!({"workspace": {"mode": "rw", "cwd": "/proc/self/fd/7"}}),
            "tighten: workspace.cwd: unknown field; accepted here: image, mode, local_userland",
        ),
    ];
    for (ask, message) in cases {
        assert_eq!(
            resolve_json(&offline, ask.clone()).unwrap_err(),
            *message,
            "ask: {ask}"
        );
    }
    let huge: Vec<String> = (0..2000).map(|index| format!("s{index}")).collect();
    assert_eq!(
        resolve_json(&offline, json!({"servers": huge})).unwrap_err(),
        "tighten: servers: 2000 entries is more than 1024"
    );
}

/// A tightening 10 000 levels deep never reaches `resolve`: the JSON parser's
/// recursion limit refuses it, and `resolve` refuses the outer shape anyway.
#[test]
fn a_deep_tightening_is_refused() {
    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    let error = serde_json::from_str::<Value>(&deep).unwrap_err();
    assert!(
        error.to_string().contains("recursion limit exceeded"),
        "{error}"
    );
    let mut nested = json!({});
    for _ in 0..100 {
        nested = json!({"limits": nested});
    }
    assert_eq!(
        resolve_json(&profile(EGRESS), nested).unwrap_err(),
        "tighten: limits.limits: unknown field; accepted here: memory, cpus, pids, tmp, home, nofile, call_timeout, idle, lifetime, start_timeout"
    );
}

#[test]
fn no_fs_has_no_workspace_unit() {
    let catalog = Catalog::only(Vec::new());
    let no_fs = catalog.load("no-fs").unwrap();
    let plan = resolve_json(&no_fs, Value::Null).unwrap();
    assert!(plan.workspace().is_none());
    assert!(plan.units.is_empty());
    assert_eq!(
        resolve_json(&no_fs, json!({"workspace": {"mode": "ro"}})).unwrap_err(),
        "tighten: workspace.mode: profile `no-fs` has no workspace to narrow"
    );
    let servers = profile(
        "extends = \"no-fs\"\n[[server]]\nname = \"one\"\nimage = \"one:1\"\ncommand = [\"one\"]\n",
    );
    let plan = resolve_json(&servers, Value::Null).unwrap();
    assert!(plan.workspace().is_none());
    assert_eq!(plan.units.len(), 1);
    assert_eq!(plan.units[0].source, WorkspaceSource::None);
    assert_eq!(
        resolve_json(&no_fs, json!({"limits": {"memory": "1GiB"}})).unwrap_err(),
        "tighten: limits.memory: profile `no-fs` has no workspace unit to narrow (narrow its servers with \"servers\")"
    );
    assert_eq!(
        resolve_json(&no_fs, json!({"network": {"mode": "none"}})).unwrap_err(),
        "tighten: network: profile `no-fs` has no workspace unit to narrow (narrow its servers with \"servers\")"
    );
    // Idle, lifetime and the start deadline are the session's, so they narrow every unit.
    let plan = resolve_json(
        &servers,
        json!({"limits": {"idle": "5m", "lifetime": "1h", "start_timeout": "20s"}}),
    )
    .unwrap();
    assert_eq!(
        plan.units[0].limits.start_timeout,
        std::time::Duration::from_secs(20)
    );
    assert_eq!(
        plan.units[0].limits.idle,
        std::time::Duration::from_secs(300)
    );
    assert_eq!(
        plan.units[0].limits.lifetime,
        std::time::Duration::from_secs(3600)
    );
}

#[test]
fn users_and_sources_resolve_against_host_facts() {
    let host = HostFacts {
        cwd: PathBuf::from("/w"),
        caller: UserIds { uid: 7, gid: 8 },
        // A non-root caller's unit is the caller's, whoever owns the workspace.
        workspace_owner: Some(UserIds {
            uid: 1000,
            gid: 1000,
        }),
    };
    let user = |text: &str| resolve(&profile(text), &Value::Null, &host).unwrap().units[0].user;
    assert_eq!(
        user("description = \"x\"\n"),
        Some(UserIds { uid: 7, gid: 8 })
    );
    assert_eq!(user("[workspace]\nuser = \"image\"\n"), None);
    assert_eq!(
        user("[workspace]\nuser = \"0:0\"\n"),
        Some(UserIds { uid: 0, gid: 0 })
    );
    let source = |text: &str| {
        resolve(&profile(text), &Value::Null, &host).unwrap().units[0]
            .source
            .clone()
    };
    assert_eq!(
        source("description = \"x\"\n"),
        WorkspaceSource::Host(PathBuf::from("/w"))
    );
    assert_eq!(
        source("[workspace]\nsource = \"empty\"\n"),
        WorkspaceSource::Empty
    );
    assert_eq!(
        source("[workspace]\nsource = \"/srv/r\"\n"),
        WorkspaceSource::Host(PathBuf::from("/srv/r"))
    );
}

/// `resolve --json` of every shipped profile, against fixed host facts, is
/// committed under tests/golden/. `BOX_UPDATE_GOLDEN=1` rewrites them.
#[test]
fn shipped_profiles_resolve_to_their_golden_plans() {
    let catalog = Catalog::only(Vec::new());
    let golden = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden");
    let update = std::env::var_os("BOX_UPDATE_GOLDEN").is_some();
    for (name, _) in crate::profile::SHIPPED {
        let plan = resolve(
            &catalog.load(name).unwrap(),
            &Value::Null,
            &HostFacts::fixed(),
        )
        .unwrap();
        let text = format!(
            "{}\n",
            serde_json::to_string_pretty(&plan.to_json()).unwrap()
        );
        let path = golden.join(format!("resolve-{name}.json"));
        if update {
            std::fs::create_dir_all(&golden).unwrap();
            std::fs::write(&path, &text).unwrap();
        }
        let expected = std::fs::read_to_string(&path).unwrap_or_default();
        assert_eq!(
            text,
            expected,
            "{} differs (BOX_UPDATE_GOLDEN=1 rewrites it)",
            path.display()
        );
    }
}

// Properties.

fn size_json(max_mib: u64) -> impl Strategy<Value = Value> {
    (1..=max_mib).prop_map(|mib| json!(format!("{mib}MiB")))
}

fn duration_json(max_minutes: u64) -> impl Strategy<Value = Value> {
    (1..=max_minutes).prop_map(|minutes| json!(format!("{minutes}m")))
}

/// Tightenings, most of them plausible, some wider than [`EGRESS`] allows.
fn tightenings() -> impl Strategy<Value = Value> {
    let limits = (
        proptest::option::of(size_json(4096)),
        proptest::option::of((1_u64..=4000).prop_map(|millis| json!(millis as f64 / 1000.0))),
        proptest::option::of((1_u64..=1024).prop_map(|pids| json!(pids))),
        proptest::option::of(size_json(512)),
        proptest::option::of((1_u64..=8192).prop_map(|nofile| json!(nofile))),
        proptest::option::of(duration_json(20)),
        proptest::option::of(duration_json(60)),
        proptest::option::of(duration_json(960)),
        proptest::option::of(duration_json(2)),
    )
        .prop_map(
            |(memory, cpus, pids, tmp, nofile, call_timeout, idle, lifetime, start_timeout)| {
                let mut map = serde_json::Map::new();
                for (key, value) in [
                    ("memory", memory),
                    ("cpus", cpus),
                    ("pids", pids),
                    ("tmp", tmp),
                    ("nofile", nofile),
                    ("call_timeout", call_timeout),
                    ("idle", idle),
                    ("lifetime", lifetime),
                    ("start_timeout", start_timeout),
                ] {
                    if let Some(value) = value {
                        map.insert(key.to_owned(), value);
                    }
                }
                Value::Object(map)
            },
        );
    let network = proptest::option::of((
        proptest::option::of(prop_oneof![Just("none"), Just("egress"), Just("bridge")]),
        proptest::option::of(proptest::sample::subsequence(
            vec![
                "example.com:443",
                "api.example.com",
                "api.example.com:1",
                "evil.com",
                "example.com",
            ],
            0..=3,
        )),
    ));
    let mode = proptest::option::of(prop_oneof![Just("ro"), Just("rw")]);
    let servers = proptest::option::of(proptest::sample::subsequence(
        vec!["one", "two", "three"],
        0..=3,
    ));
    let drop = proptest::sample::subsequence(
        vec!["CI", "MODE", "LANG", "TERM", "GITHUB_TOKEN", "OTHER"],
        0..=6,
    );
    (limits, network, mode, servers, drop).prop_map(|(limits, network, mode, servers, drop)| {
        let mut ask = serde_json::Map::new();
        ask.insert("limits".to_owned(), limits);
        if let Some((mode, allow)) = network {
            let mut map = serde_json::Map::new();
            if let Some(mode) = mode {
                map.insert("mode".to_owned(), json!(mode));
            }
            if let Some(allow) = allow {
                map.insert("allow".to_owned(), json!(allow));
            }
            ask.insert("network".to_owned(), Value::Object(map));
        }
        if let Some(mode) = mode {
            ask.insert("workspace".to_owned(), json!({"mode": mode}));
        }
        if let Some(servers) = servers {
            ask.insert("servers".to_owned(), json!(servers));
        }
        ask.insert("env".to_owned(), json!({"drop": drop}));
        Value::Object(ask)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A tightened plan is never wider than its profile's untightened plan, in any field.
    #[test]
    fn a_tightened_plan_is_never_wider(ask in tightenings()) {
        let profile = profile(EGRESS);
        let bound = resolve(&profile, &Value::Null, &HostFacts::fixed()).unwrap();
        if let Ok(plan) = resolve(&profile, &ask, &HostFacts::fixed()) {
            prop_assert!(plan.is_within(&bound), "{ask}");
        }
    }

    /// Tightening twice by the same ask equals tightening once.
    #[test]
    fn tightening_is_idempotent(ask in tightenings()) {
        let profile = profile(EGRESS);
        let tightening = Tightening::parse(&ask).unwrap();
        if let Ok(once) = tighten(&profile, &tightening) {
            prop_assert_eq!(tighten(&once, &tightening).unwrap(), once);
        }
    }

    /// Monotone: a second tightening of a tightened profile is within the first.
    #[test]
    fn tightening_is_monotone(first in tightenings(), second in tightenings()) {
        let profile = profile(EGRESS);
        let Ok(once) = tighten(&profile, &Tightening::parse(&first).unwrap()) else { return Ok(()) };
        let once_plan = resolve(&once, &Value::Null, &HostFacts::fixed()).unwrap();
        if let Ok(twice) = resolve(&once, &second, &HostFacts::fixed()) {
            prop_assert!(twice.is_within(&once_plan), "{first} then {second}");
            // And what the second ask accepts on the narrowed profile, the original accepts too.
            prop_assert!(resolve(&profile, &second, &HostFacts::fixed()).is_ok(), "{second}");
        }
    }

    /// Resolution is deterministic.
    #[test]
    fn resolve_is_deterministic(ask in tightenings()) {
        let profile = profile(EGRESS);
        let one = resolve(&profile, &ask, &HostFacts::fixed());
        let two = resolve(&profile, &ask, &HostFacts::fixed());
        prop_assert_eq!(one, two);
    }
}

/// Any JSON value at all.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|number| json!(number)),
        any::<f64>().prop_map(|number| json!(number)),
        "[a-z_ .:0-9]{0,12}".prop_map(Value::String),
        prop_oneof![
            Just("1GiB"),
            Just("none"),
            Just("egress"),
            Just("ro"),
            Just("5m"),
            Just("one")
        ]
        .prop_map(|text| json!(text)),
    ];
    leaf.prop_recursive(6, 64, 6, |inner| {
        let key = prop_oneof![
            Just("workspace"),
            Just("network"),
            Just("limits"),
            Just("servers"),
            Just("env"),
            Just("mode"),
            Just("allow"),
            Just("memory"),
            Just("pids"),
            Just("drop"),
            Just("cpus"),
            Just("image"),
            Just("x"),
        ];
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::vec((key, inner), 0..6).prop_map(|entries| {
                Value::Object(
                    entries
                        .into_iter()
                        .map(|(key, value)| (key.to_owned(), value))
                        .collect(),
                )
            }),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever a session sends, resolve answers (never panics), and what it
    /// accepts is within the profile.
    #[test]
    fn any_json_is_answered_and_never_widens(ask in any_json()) {
        let profile = profile(EGRESS);
        let bound = resolve(&profile, &Value::Null, &HostFacts::fixed()).unwrap();
        if let Ok(plan) = resolve(&profile, &ask, &HostFacts::fixed()) {
            prop_assert!(plan.is_within(&bound), "{ask}");
        }
    }

    /// A limit above the profile's is always refused, naming the field.
    #[test]
    fn a_wider_limit_is_always_refused(field in 0_usize..9, excess in 1_u64..1000) {
        let ask = match field {
            0 => json!({"memory": format!("{}MiB", 2048 + excess)}),
            1 => json!({"cpus": 2.0 + excess as f64 / 1000.0}),
            2 => json!({"pids": 512 + excess}),
            3 => json!({"tmp": format!("{}MiB", 256 + excess)}),
            4 => json!({"nofile": 4096 + excess}),
            5 => json!({"call_timeout": format!("{}s", 600 + excess)}),
            6 => json!({"idle": format!("{}s", 1800 + excess)}),
            7 => json!({"start_timeout": format!("{}s", 60 + excess)}),
            _ => json!({"lifetime": format!("{}s", 8 * 3600 + excess)}),
        };
        let name = ask.as_object().unwrap().keys().next().unwrap().clone();
        let error = resolve(&profile(EGRESS), &json!({"limits": ask}), &HostFacts::fixed()).unwrap_err();
        let PlanError::Widening { field, .. } = error else {
            return Err(TestCaseError::fail(format!("not a widening error: {error}")));
        };
        prop_assert_eq!(field, format!("limits.{name}"));
    }
}

/// Issue 8, item 4: a `cwd` source that resolves to a dangerous path (a
/// system directory, `/`, a home directory, the engine socket's directory)
/// is refused like the same path written out, naming the field and the
/// resolved path, and the same operator switch lets it through.
#[test]
fn a_cwd_resolving_to_a_dangerous_path_is_refused_like_the_path_itself() {
    let resolve_in = |text: &str, cwd: &str| {
        let host = HostFacts {
            cwd: PathBuf::from(cwd),
            caller: UserIds {
                uid: 1000,
                gid: 1000,
            },
            workspace_owner: None,
        };
        resolve(&profile(text), &Value::Null, &host)
            .map(|_| ())
            .map_err(|error| error.to_string())
    };
    for (cwd, danger) in [
        ("/", "host-root"),
        ("/etc", "host-root"),
        ("/etc/nginx", "host-root"),
        ("/root", "host-root"),
        ("/home", "host-root"),
        ("/home/alice", "host-root"),
        ("/usr", "host-root"),
        ("/proc/1", "host-root"),
        ("/run", "docker-socket"),
        ("/var/run", "docker-socket"),
    ] {
        let error = resolve_in("description = \"x\"\n", cwd).unwrap_err();
        assert!(
            error.starts_with(&format!(
                "workspace.source = \"cwd\" resolved to {cwd}, which "
            )) && error.contains("refused as dangerous"),
            "{cwd}: {error}"
        );
        assert!(
            error.contains(&format!("allow_dangerous = [\"{danger}\"]")),
            "{cwd}: {error}"
        );
        // The next step is a profile of one's own, never an edit of this one.
        assert!(
            error.contains("write a profile of your own that extends this one")
                && error.contains("extends = \"p\"")
                && error.contains("--workspace DIR"),
            "{cwd}: {error}"
        );
        let allowed = format!("[operator]\nallow_dangerous = [\"{danger}\"]\n");
        assert_eq!(resolve_in(&allowed, cwd), Ok(()), "{cwd} allowed");
    }
    // A home directory is told as one: root's too.
    for cwd in ["/root", "/home/alice"] {
        let error = resolve_in("description = \"x\"\n", cwd).unwrap_err();
        assert!(
            error.contains(&format!("resolved to {cwd}, which is a home directory")),
            "{cwd}: {error}"
        );
    }
    for cwd in [
        "/home/alice/project",
        "/root/project",
        "/tmp",
        "/tmp/x",
        "/srv/repo",
        "/var/tmp/x",
        "/usr/src/app",
    ] {
        assert_eq!(resolve_in("description = \"x\"\n", cwd), Ok(()), "{cwd}");
    }
    // `.` and `..` do not walk past the rules.
    let error = resolve_in("description = \"x\"\n", "/tmp/../etc/.").unwrap_err();
    assert!(
        error.starts_with("workspace.source = \"cwd\" resolved to /etc, which "),
        "{error}"
    );
    // A source written out is judged when the profile loads, not here.
    assert_eq!(
        resolve_in("[workspace]\nsource = \"empty\"\n", "/etc"),
        Ok(())
    );
}

/// A session chooses its workspace image among the profile's `image` and
/// `images`, and nothing else; the pull policy goes with the unit.
#[test]
fn a_session_chooses_its_image_from_the_profiles_set() {
    let pinned = format!("localhost:5000/tool@sha256:{}", "a".repeat(64));
    let profile = profile(&format!(
        "[workspace]\nimage = \"one:1\"\nimages = [\"alt:2\", \"{pinned}\"]\npull = \"never\"\n[[server]]\nname = \"s\"\nimage = \"s:1\"\ncommand = [\"s\"]\npull = \"always\"\n"
    ));
    let plan = resolve_json(&profile, Value::Null).unwrap();
    let workspace = plan.workspace().unwrap();
    assert_eq!(workspace.image, "one:1");
    assert_eq!(workspace.pull, crate::image::PullPolicy::Never);
    assert_eq!(
        plan.servers().next().unwrap().pull,
        crate::image::PullPolicy::Always
    );
    for chosen in ["one:1", "alt:2", pinned.as_str()] {
        let plan = resolve_json(&profile, json!({"workspace": {"image": chosen}})).unwrap();
        assert_eq!(plan.workspace().unwrap().image, chosen);
    }
    assert_eq!(
        resolve_json(&profile, json!({"workspace": {"image": "alt:3"}})).unwrap_err(),
        format!(
            "tighten.workspace.image: asked for \"alt:3\", but profile `p` allows at most [\"one:1\", \"alt:2\", \"{pinned}\"] (its image and images)"
        )
    );
    // The same repository at another digest is another image.
    let other = format!("localhost:5000/tool@sha256:{}", "b".repeat(64));
    assert!(resolve_json(&profile, json!({"workspace": {"image": other}})).is_err());
    assert_eq!(
        resolve_json(&profile, json!({"workspace": {"image": "a b"}})).unwrap_err(),
        "tighten: workspace.image: \"a b\" has ' ' in it; write an image like \"rust:1.83\", \"ghcr.io/org/tool:v1\" or \"NAME@sha256:<64 hex digits>\""
    );
    let no_fs = self::profile("[workspace]\nsource = \"none\"\n");
    assert!(
        resolve_json(&no_fs, json!({"workspace": {"image": "box-base:bookworm"}}))
            .unwrap_err()
            .contains("has no workspace unit")
    );
}

/// Issue 22, item 4: a session may narrow `local_userland` to `refuse`,
/// never widen it; choosing another image than the profile's clears it (the
/// leave was for that image); the plan shows it.
#[test]
fn local_userland_narrows_only_and_goes_with_the_image() {
    let profile = profile(
        "description = \"x\"\n[workspace]\nimage = \"a:1\"\nimages = [\"b:1\"]\nlocal_userland = \"host\"\n",
    );
    let userland = |tighten: Value| {
        resolve_json(&profile, tighten).map(|plan| plan.workspace().unwrap().local_userland)
    };
    assert_eq!(userland(Value::Null), Ok(LocalUserland::Host));
    assert_eq!(
        userland(json!({"workspace": {"local_userland": "refuse"}})),
        Ok(LocalUserland::Refuse)
    );
    assert_eq!(
        userland(json!({"workspace": {"image": "a:1"}})),
        Ok(LocalUserland::Host)
    );
    assert_eq!(
        userland(json!({"workspace": {"image": "b:1"}})),
        Ok(LocalUserland::Refuse)
    );
    assert_eq!(
        userland(json!({"workspace": {"image": "b:1", "local_userland": "host"}})),
        Err("tighten.workspace.local_userland: asked for \"host\", but profile `p` allows at most \"refuse\"".to_owned())
    );
    assert_eq!(
        userland(json!({"workspace": {"local_userland": "maybe"}})),
        Err("tighten: workspace.local_userland: \"maybe\" is not accepted; write \"refuse\" or \"host\"".to_owned())
    );
    let plan = resolve_json(&profile, Value::Null).unwrap();
    assert_eq!(plan.to_json()["units"][0]["localUserland"], json!("host"));
    let refused = profile_without_userland();
    assert_eq!(
        resolve_json(&refused, json!({"workspace": {"local_userland": "host"}})),
        Err("tighten.workspace.local_userland: asked for \"host\", but profile `p` allows at most \"refuse\"".to_owned())
    );
    let plan = resolve_json(&refused, Value::Null).unwrap();
    assert_eq!(plan.to_json()["units"][0].get("localUserland"), None);
}

fn profile_without_userland() -> Profile {
    profile("description = \"x\"\n[workspace]\nimage = \"a:1\"\n")
}

/// Issue 23, item 3: with `user = "host"`, a root caller's unit runs as the
/// owner of its workspace when that owner is not root (servers too); uid 0
/// only when the workspace is root's, there is none, or the profile writes
/// `user = "0:0"`.
#[test]
fn a_root_callers_unit_runs_as_the_workspaces_owner() {
    let root = UserIds { uid: 0, gid: 0 };
    let owner = UserIds {
        uid: 1000,
        gid: 1001,
    };
    let host = |workspace_owner| HostFacts {
        cwd: PathBuf::from("/w"),
        caller: root,
        workspace_owner,
    };
    let users = |text: &str, facts: &HostFacts| -> Vec<Option<UserIds>> {
        resolve(&profile(text), &Value::Null, facts)
            .unwrap()
            .units
            .iter()
            .map(|unit| unit.user)
            .collect()
    };
    let server = "[[server]]\nname = \"s\"\nimage = \"i:1\"\ncommand = [\"s\"]\n";
    assert_eq!(
        users(server, &host(Some(owner))),
        vec![Some(owner), Some(owner)]
    );
    assert_eq!(
        users(server, &host(Some(root))),
        vec![Some(root), Some(root)]
    );
    assert_eq!(users(server, &host(None)), vec![Some(root), Some(root)]);
    assert_eq!(
        users("[workspace]\nuser = \"0:0\"\n", &host(Some(owner))),
        vec![Some(root)]
    );
    assert_eq!(
        users("[workspace]\nuser = \"image\"\n", &host(Some(owner))),
        vec![None]
    );
}

/// A tightening's choices are written in the profile's words, and a wrong
/// one is told them as a profile's error tells them.
#[test]
fn a_tightening_is_told_the_profiles_words() {
    let told = |ask: Value| {
        Tightening::parse(&ask)
            .map(|_| ())
            .map_err(|error| error.to_string())
    };
    assert_eq!(
        told(json!({"workspace": {"mode": "readonly"}})),
        Err(
            "tighten: workspace.mode: \"readonly\" is not accepted; write \"rw\" or \"ro\""
                .to_owned()
        )
    );
    assert_eq!(
        told(json!({"network": {"mode": "host"}})),
        Err("tighten: network.mode: \"host\" is not accepted; write \"none\", \"egress\" or \"bridge\"".to_owned())
    );
    assert_eq!(
        told(json!({"workspace": {"mode": 1}})),
        Err("tighten: workspace.mode: expected a string, got a number".to_owned())
    );
    assert_eq!(
        told(
            json!({"workspace": {"mode": "ro", "local_userland": "refuse"}, "network": {"mode": "none"}})
        ),
        Ok(())
    );
}
