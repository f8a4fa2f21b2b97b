//! Loading and validation: every bad input gets one precise, located error.

use std::path::PathBuf;

use pretty_assertions::assert_eq;

use super::*;
use crate::plan::{MountMode, NetworkMode, Requirement, UserIds};

/// Write `files` (name, TOML) into a fresh directory and load `name` from it.
fn load(files: &[(&str, &str)], name: &str) -> Result<Profile, ProfileError> {
    let dir = tempfile::tempdir().unwrap();
    for (file, text) in files {
        std::fs::write(dir.path().join(format!("{file}.toml")), text).unwrap();
    }
    Catalog::only(vec![dir.path().to_path_buf()]).load(name)
}

/// The problems of loading `text` as profile `p`, with the temp path replaced by `p.toml`.
fn problems(text: &str) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.toml"), text).unwrap();
    let error = Catalog::only(vec![dir.path().to_path_buf()])
        .load("p")
        .unwrap_err();
    let prefix = format!("{}/", dir.path().display());
    error
        .problems
        .iter()
        .map(|problem| problem.to_string().replace(&prefix, ""))
        .collect()
}

#[test]
fn shipped_profiles_all_load() {
    let catalog = Catalog::only(Vec::new());
    for (name, _) in SHIPPED {
        let profile = catalog.load(name).unwrap();
        assert_eq!(profile.name, *name);
        assert!(!profile.description.is_empty(), "{name} has no description");
        assert!(profile.dangerous.is_empty(), "{name} is dangerous");
    }
}

#[test]
fn shipped_default_is_strict() {
    let profile = Catalog::only(Vec::new()).load("default").unwrap();
    assert_eq!(profile.workspace.source, Source::Cwd);
    assert_eq!(profile.workspace.mode, MountMode::ReadWrite);
    assert_eq!(profile.network.mode, NetworkMode::None);
    assert!(profile.security.capabilities.is_empty());
    assert!(profile.security.read_only_root);
    assert!(profile.security.neutralise_git);
    assert!(profile.security.write_guard);
    assert!(!profile.security.privileged);
    assert_eq!(profile.security.landlock, Requirement::Required);
    assert_eq!(profile.lifecycle.lease, std::time::Duration::from_secs(30));
    assert_eq!(profile.pool.size, 0, "no shipped profile keeps warm units");
}

#[test]
fn a_profiles_pool_is_read_and_extended() {
    let files = [
        ("base", "extends = \"default\"\n\n[pool]\nsize = 4\n"),
        ("child", "extends = \"base\"\n"),
        ("off", "extends = \"base\"\n\n[pool]\nsize = 0\n"),
    ];
    assert_eq!(load(&files, "base").unwrap().pool.size, 4);
    assert_eq!(load(&files, "child").unwrap().pool.size, 4);
    assert_eq!(load(&files, "off").unwrap().pool.size, 0);
}

#[test]
fn shipped_offline_and_no_fs() {
    let catalog = Catalog::only(Vec::new());
    let offline = catalog.load("offline").unwrap();
    assert_eq!(offline.workspace.mode, MountMode::ReadOnly);
    assert_eq!(offline.network.mode, NetworkMode::None);
    assert_eq!(offline.extends, vec!["default".to_owned()]);
    let no_fs = catalog.load("no-fs").unwrap();
    assert_eq!(no_fs.workspace.source, Source::None);
    assert!(no_fs.servers.is_empty());
    let fetch = catalog.load("fetch").unwrap();
    assert_eq!(fetch.servers.len(), 1);
    assert_eq!(fetch.servers[0].network.mode, NetworkMode::Egress);
    assert_eq!(fetch.servers[0].limits.memory, ByteSize(512 << 20));
    assert_eq!(fetch.servers[0].limits.idle, fetch.limits.idle);
}

#[test]
fn a_minimal_profile_gets_the_strict_defaults() {
    let profile = load(&[("p", "description = \"x\"\n")], "p").unwrap();
    assert_eq!(profile.workspace.image, "box-base:bookworm");
    assert_eq!(profile.workspace.root, PathBuf::from("/workspace"));
    assert_eq!(profile.workspace.user, UserChoice::Host);
    assert_eq!(profile.network.mode, NetworkMode::None);
    assert_eq!(profile.limits.memory, ByteSize(2 << 30));
    assert!(profile.env.pass.is_empty());
}

#[test]
fn every_field_is_read() {
    let text = r#"
description = "all"
[workspace]
image = "img:1"
pull_secret = "REGISTRY_AUTH"
root = "/src"
source = "/srv/repo"
mode = "ro"
user = "1001:1002"
runtime = "runsc"
[network]
mode = "egress"
allow = ["example.com:443", "10.0.0.1"]
[limits]
memory = "512MiB"
cpus = 0.5
pids = 64
tmp = "16MiB"
home = "32MiB"
nofile = 256
call_timeout = "1m"
idle = "5m"
lifetime = "1h 30m"
[env]
set = { A = "1" }
pass = ["LANG"]
secrets = ["GITHUB_TOKEN"]
[security]
capabilities = ["CAP_CHOWN", "KILL"]
read_only_root = false
landlock = "required"
git = "off"
write_guard = "off"
"#;
    let profile = load(&[("p", text)], "p").unwrap();
    assert_eq!(
        profile.workspace,
        Workspace {
            image: "img:1".to_owned(),
            images: Vec::new(),
            pull: crate::image::PullPolicy::Missing,
            pull_secret: Some("REGISTRY_AUTH".to_owned()),
            root: PathBuf::from("/src"),
            source: Source::Host(PathBuf::from("/srv/repo")),
            mode: MountMode::ReadOnly,
            user: UserChoice::Ids(UserIds {
                uid: 1001,
                gid: 1002
            }),
            on_persisted_credentials: super::OnPersisted::Report,
            fork_mode: super::ForkMode::Auto,
            runtime: Some("runsc".to_owned()),
            local_userland: crate::plan::LocalUserland::Refuse,
        }
    );
    assert_eq!(profile.network.allow.len(), 2);
    assert_eq!(
        profile.limits,
        LimitsPolicy {
            memory: ByteSize(512 << 20),
            cpus: CpuQuota(500),
            pids: 64,
            tmp: ByteSize(16 << 20),
            home: ByteSize(32 << 20),
            nofile: 256,
            call_timeout: std::time::Duration::from_secs(60),
            idle: std::time::Duration::from_secs(300),
            lifetime: std::time::Duration::from_secs(5400),
            // The rest (the start deadline) as the defaults.
            ..LimitsPolicy::defaults()
        }
    );
    assert_eq!(profile.env.secret_names(), vec!["GITHUB_TOKEN".to_owned()]);
    assert_eq!(
        profile.security.capabilities,
        vec!["CHOWN".to_owned(), "KILL".to_owned()]
    );
    assert_eq!(profile.security.landlock, Requirement::Required);
    assert!(!profile.security.neutralise_git);
    assert!(!profile.security.write_guard);
    assert!(!profile.security.read_only_root);
}

#[test]
fn bad_input_gets_one_precise_error() {
    let cases: &[(&str, &str)] = &[
        (
            "",
            "p.toml:1:1: the file is empty; a profile needs at least `description = \"...\"`",
        ),
        (
            "\u{feff}description = \"x\"\n",
            "p.toml:1:1: the file starts with a byte-order mark (BOM); save it as UTF-8 without one",
        ),
        (
            "description = \"a\"\ndescription = \"b\"\n",
            "p.toml:2:1: not valid TOML: duplicate key",
        ),
        (
            "description = \n",
            "p.toml:1:15: not valid TOML: string values must be quoted, expected literal string",
        ),
        (
            "colour = \"red\"\n",
            "p.toml:1:1: colour: unknown field; accepted here: description, extends, workspace, network, limits, env, security, lifecycle, pool, server, volume, operator",
        ),
        (
            "[workspace]\nimgae = \"x\"\n",
            "p.toml:2:1: workspace.imgae: unknown field; accepted here: image, images, pull, pull_secret, root, source, mode, user, runtime, local_userland, on_persisted_credentials, fork_mode",
        ),
        (
            "description = 5\n",
            "p.toml:1:15: description: expected a string, got 5 (an integer)",
        ),
        (
            "workspace = 5\n",
            "p.toml:1:13: workspace: expected a table, got 5 (an integer)",
        ),
        (
            "[workspace]\nmode = \"rwx\"\n",
            "p.toml:2:8: workspace.mode: \"rwx\" is not accepted; write \"rw\" or \"ro\"",
        ),
        (
            "[workspace]\nmode = true\n",
            "p.toml:2:8: workspace.mode: expected \"rw\" or \"ro\", got true (a boolean)",
        ),
        (
            "[workspace]\nsource = \"relative/dir\"\n",
            "p.toml:2:10: workspace.source: \"relative/dir\" is not accepted; write \"cwd\", \"fork\", \"empty\", \"none\" or an absolute host path (with no . or .. parts)",
        ),
        (
            "[workspace]\nsource = \"/srv/../etc\"\n",
            "p.toml:2:10: workspace.source: \"/srv/../etc\" is not accepted; write \"cwd\", \"fork\", \"empty\", \"none\" or an absolute host path (with no . or .. parts)",
        ),
        (
            "[workspace]\nroot = \"/\"\n",
            "p.toml:2:8: workspace.root: \"/\" is not usable; write an absolute path inside the unit other than /, with no . or .. parts, like \"/workspace\"",
        ),
        (
            "[workspace]\nuser = \"root\"\n",
            "p.toml:2:8: workspace.user: \"root\" is not accepted; write \"host\" (the caller's ids), \"image\" (the image's user) or \"UID:GID\" like \"1000:1000\"",
        ),
        (
            "[workspace]\nimage = \"\"\n",
            "p.toml:2:9: workspace.image: \"\" is not an image reference; write an image like \"rust:1.83\", \"ghcr.io/org/tool:v1\" or \"NAME@sha256:<64 hex digits>\"",
        ),
        (
            "[workspace]\nimage = \"tool@sha256:abc\"\n",
            "p.toml:2:9: workspace.image: \"tool@sha256:abc\": \"sha256:abc\" is not a digest; a pinned image is NAME@sha256:<64 lowercase hex digits> (`docker buildx imagetools inspect NAME:TAG` or `box image pull NAME:TAG` prints it)",
        ),
        (
            "[workspace]\npull = \"sometimes\"\n",
            "p.toml:2:8: workspace.pull: \"sometimes\" is not accepted; write \"never\", \"missing\" or \"always\"",
        ),
        (
            "[workspace]\npull_secret = \"user:pw\"\n",
            "p.toml:2:15: workspace.pull_secret: \"user:pw\" is not a variable name; use letters, digits and _, not starting with a digit",
        ),
        (
            "[workspace]\npull_secret = true\n",
            "p.toml:2:15: workspace.pull_secret: expected the name of a host variable holding user:password, like \"REGISTRY_AUTH\", got true (a boolean)",
        ),
        (
            "[workspace]\nimages = [\"a:1\", \"a:1\"]\n",
            "p.toml:2:18: workspace.images: \"a:1\" is listed twice",
        ),
        (
            "[limits]\nmemory = \"2 gigs\"\n",
            "p.toml:2:10: limits.memory: \"2 gigs\" is not a size; write a whole number and a unit (B, KiB, MiB, GiB or TiB), like \"2GiB\"",
        ),
        (
            "[limits]\nmemory = 2048\n",
            "p.toml:2:10: limits.memory: expected a size like \"2GiB\", got 2048 (an integer)",
        ),
        (
            "[limits]\ntmp = \"0MiB\"\n",
            "p.toml:2:7: limits.tmp: \"0MiB\" is zero; a size must be more than zero",
        ),
        (
            "[limits]\npids = -1\n",
            "p.toml:2:8: limits.pids: -1 is not more than zero; write a whole number from 1",
        ),
        (
            "[limits]\npids = 0\n",
            "p.toml:2:8: limits.pids: 0 is not more than zero; write a whole number from 1",
        ),
        (
            "[limits]\nnofile = 1.5\n",
            "p.toml:2:10: limits.nofile: expected a whole number like 512, got 1.5 (a float)",
        ),
        (
            "[limits]\ncpus = -2\n",
            "p.toml:2:8: limits.cpus: -2 is not a CPU quota; write a number of cores more than zero, like 2 or 0.5",
        ),
        (
            "[limits]\ncpus = \"2\"\n",
            "p.toml:2:8: limits.cpus: expected a number of cores like 2 or 0.5, got \"2\" (a string)",
        ),
        (
            "[lifecycle]\nlease = \"500ms\"\n",
            "p.toml:2:9: lifecycle.lease: \"500ms\" is out of bounds; a lease is from 1s to 1h (a unit ends that long after its host stops renewing it)",
        ),
        (
            "[lifecycle]\nlease = \"2h\"\n",
            "p.toml:2:9: lifecycle.lease: \"2h\" is out of bounds; a lease is from 1s to 1h (a unit ends that long after its host stops renewing it)",
        ),
        (
            "[lifecycle]\nttl = \"2s\"\n",
            "p.toml:2:1: lifecycle.ttl: unknown field; accepted here: lease",
        ),
        (
            "[pool]\nsize = 1000\n",
            "p.toml:2:8: pool.size: 1000 is out of bounds; a pool keeps from 0 to 256 units ready",
        ),
        (
            "[pool]\nsize = \"4\"\n",
            "p.toml:2:8: pool.size: expected a whole number like 512, got \"4\" (a string)",
        ),
        (
            "[pool]\nunits = 4\n",
            "p.toml:2:1: pool.units: unknown field; accepted here: size",
        ),
        (
            "[limits]\nidle = \"forever\"\n",
            "p.toml:2:8: limits.idle: \"forever\" is not a duration; write a number and a unit (s, m, h, d), like \"10m\" or \"1h 30m\"",
        ),
        (
            "[limits]\nlifetime = \"0s\"\n",
            "p.toml:2:12: limits.lifetime: \"0s\" is zero; a duration must be more than zero",
        ),
        (
            "[limits]\nstart_timeout = \"0s\"\n",
            "p.toml:2:17: limits.start_timeout: \"0s\" is zero; a duration must be more than zero",
        ),
        (
            "[[server]]\nname = \"b\"\nimage = \"b:1\"\ncommand = [\"b\"]\nlimits = { start_timeout = \"5s\" }\n",
            "p.toml:5:12: server[b].limits.start_timeout: unknown field; accepted here: memory, cpus, pids, tmp, home, nofile, call_timeout",
        ),
        (
            "[network]\nmode = \"egress\"\nallow = [\"https://example.com\"]\n",
            "p.toml:3:10: network.allow: allow entry \"https://example.com\" has a scheme; write only the host; write host, *.suffix or host:port, like \"example.com\" (ports 80 and 443), \"*.example.com\" or \"example.com:8443\"",
        ),
        (
            "[network]\nmode = \"egress\"\nallow = [\"example.com:99999\"]\n",
            "p.toml:3:10: network.allow: allow entry \"example.com:99999\" has a port that is not a number from 1 to 65535; write host, *.suffix or host:port, like \"example.com\" (ports 80 and 443), \"*.example.com\" or \"example.com:8443\"",
        ),
        (
            "[network]\nmode = \"egress\"\n",
            "p.toml:2:8: network.mode: \"egress\" needs a non-empty allow list of host[:port] entries; for no network write \"none\"",
        ),
        (
            "[network]\nallow = [\"example.com\"]\n",
            "p.toml:2:9: network.allow: an allow list only applies to mode \"egress\", but the mode is \"none\"; write allow = [] or mode = \"egress\"",
        ),
        (
            "[network]\nmode = \"host\"\n",
            "p.toml:2:8: network.mode: \"host\" is not accepted; write \"none\", \"egress\" or \"bridge\"",
        ),
        (
            "[env]\npass = [\"AWS_SECRET_ACCESS_KEY\"]\n",
            "p.toml:2:9: env.pass: \"AWS_SECRET_ACCESS_KEY\" looks like a credential; hand it through under env.secrets if you mean to",
        ),
        (
            "[env]\npass = [\"LANG\", \"LANG\"]\n",
            "p.toml:2:17: env.pass: \"LANG\" is listed twice",
        ),
        (
            "[env]\nset = { \"A B\" = \"x\" }\n",
            "p.toml:2:9: env.set.A B: \"A B\" is not a variable name; use letters, digits and _, not starting with a digit",
        ),
        (
            "[env]\npass = \"LANG\"\n",
            "p.toml:2:8: env.pass: expected an array of strings, got \"LANG\" (a string)",
        ),
        (
            "[security]\nlandlock = \"maybe\"\n",
            "p.toml:2:12: security.landlock: \"maybe\" is not accepted; write \"required\", \"best-effort\" or \"off\"",
        ),
        (
            "[security]\nread_only_root = \"yes\"\n",
            "p.toml:2:18: security.read_only_root: expected true or false, got \"yes\" (a string)",
        ),
        (
            "[security]\ncapabilities = [\"sys_admin\"]\n",
            "p.toml:2:17: security.capabilities: \"sys_admin\" is not a capability; write an upper-case name like \"NET_BIND_SERVICE\" (reviewed: CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL, NET_BIND_SERVICE, SETGID, SETUID)",
        ),
        (
            "[security]\nseccomp = \"unconfined\"\n",
            "p.toml:2:1: security.seccomp: unknown field; accepted here: capabilities, read_only_root, landlock, git, write_guard, tmp, privileged, host_namespaces, devices",
        ),
        (
            "extends = \"nothere\"\n",
            "p.toml:1:11: extends: no profile named \"nothere\" to extend; known: ci, default, dev, fetch, no-fs, offline, p",
        ),
        (
            "extends = \"p\"\n",
            "p.toml:1:11: extends: no other profile named \"p\" after this file in the search order to extend",
        ),
        (
            "extends = \"../etc/passwd\"\n",
            "p.toml:1:11: extends: \"../etc/passwd\" is not a profile name; use letters, digits, -, _ and ., starting with a letter or digit",
        ),
        (
            "extends = 3\n",
            "p.toml:1:11: extends: expected the name of a profile (a string), got 3 (an integer)",
        ),
        (
            "[[server]]\nname = \"b\"\nimage = \"i\"\n",
            "p.toml:1:1: server[b]: a server needs a command, like command = [\"mcp-server\", \"--stdio\"]",
        ),
        (
            "[[server]]\nname = \"workspace\"\nimage = \"i\"\ncommand = [\"x\"]\n",
            "p.toml:2:8: server[workspace].name: \"workspace\" is the workspace unit's name; choose another",
        ),
        (
            "[[server]]\nname = \"b\"\nimage = \"i\"\ncommand = [\"x\"]\nlimits = { idle = \"1h\" }\n",
            "p.toml:5:12: server[b].limits.idle: unknown field; accepted here: memory, cpus, pids, tmp, home, nofile, call_timeout",
        ),
        (
            "[[server]]\nname = \"b\"\nimage = \"i\"\ncommand = [\"x\"]\n[[server]]\nname = \"b\"\nimage = \"i\"\ncommand = [\"x\"]\n",
            "p.toml:6:8: server[b].name: a server named \"b\" is declared twice",
        ),
        (
            "[operator]\nallow_dangerous = [\"everything\"]\n",
            "p.toml:2:20: operator.allow_dangerous: \"everything\" is not a danger box knows; write \"docker-socket\", \"host-root\", \"privileged\", \"host-namespaces\", \"capabilities\", \"devices\" or \"private-destinations\"",
        ),
    ];
    for (text, expected) in cases {
        assert_eq!(
            problems(text),
            vec![(*expected).to_owned()],
            "input: {text:?}"
        );
    }
}

#[test]
fn dangerous_asks_are_refused_without_the_operator_switch() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "[workspace]\nsource = \"/var/run/docker.sock\"\n",
            "docker-socket",
            "p.toml:2:10: workspace.source: refused as dangerous: /var/run/docker.sock is or holds a container engine's socket (root on the host); an operator who means it writes [operator] allow_dangerous = [\"docker-socket\"]",
        ),
        (
            "[workspace]\nsource = \"/run\"\n",
            "docker-socket",
            "p.toml:2:10: workspace.source: refused as dangerous: /run is or holds a container engine's socket (root on the host); an operator who means it writes [operator] allow_dangerous = [\"docker-socket\"]",
        ),
        (
            "[workspace]\nsource = \"/\"\n",
            "host-root",
            "p.toml:2:10: workspace.source: refused as dangerous: / is the host's root or a system directory; an operator who means it writes [operator] allow_dangerous = [\"host-root\"]",
        ),
        (
            "[workspace]\nsource = \"/etc/ssh\"\n",
            "host-root",
            "p.toml:2:10: workspace.source: refused as dangerous: /etc/ssh is the host's root or a system directory; an operator who means it writes [operator] allow_dangerous = [\"host-root\"]",
        ),
        (
            "[workspace]\nsource = \"/home\"\n",
            "host-root",
            "p.toml:2:10: workspace.source: refused as dangerous: /home is the host's root or a system directory; an operator who means it writes [operator] allow_dangerous = [\"host-root\"]",
        ),
        (
            "[security]\nprivileged = true\n",
            "privileged",
            "p.toml:2:14: security.privileged: refused as dangerous: a privileged unit has every capability and every device; an operator who means it writes [operator] allow_dangerous = [\"privileged\"]",
        ),
        (
            "[security]\nhost_namespaces = [\"pid\"]\n",
            "host-namespaces",
            "p.toml:2:19: security.host_namespaces: refused as dangerous: sharing the host's pid namespace(s); an operator who means it writes [operator] allow_dangerous = [\"host-namespaces\"]",
        ),
        (
            "[security]\ncapabilities = [\"SYS_ADMIN\"]\n",
            "capabilities",
            "p.toml:2:17: security.capabilities: refused as dangerous: SYS_ADMIN is not on the reviewed list (CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL, NET_BIND_SERVICE, SETGID, SETUID); an operator who means it writes [operator] allow_dangerous = [\"capabilities\"]",
        ),
        (
            "[security]\ndevices = [\"/dev/kvm\"]\n",
            "devices",
            "p.toml:2:11: security.devices: refused as dangerous: host devices are reachable from the unit; an operator who means it writes [operator] allow_dangerous = [\"devices\"]",
        ),
    ];
    for (text, danger, expected) in cases {
        assert_eq!(
            problems(text),
            vec![(*expected).to_owned()],
            "input: {text:?}"
        );
        let allowed = format!("{text}[operator]\nallow_dangerous = [\"{danger}\"]\n");
        let profile = load(&[("p", &allowed)], "p").unwrap();
        assert_eq!(
            profile.dangerous,
            vec![Danger::from_name(danger).unwrap()],
            "{text}"
        );
    }
    // A harmless host path and the reviewed capabilities need no switch.
    let profile = load(
        &[(
            "p",
            "[workspace]\nsource = \"/home/me/repo\"\n[security]\ncapabilities = [\"CHOWN\"]\n",
        )],
        "p",
    )
    .unwrap();
    assert!(profile.dangerous.is_empty());
}

#[test]
fn an_unused_allowance_is_refused() {
    assert_eq!(
        problems("[operator]\nallow_dangerous = [\"privileged\"]\n"),
        vec!["p.toml:2:20: operator.allow_dangerous: allows \"privileged\" but the profile does not ask for it; remove it".to_owned()]
    );
}

#[test]
fn every_problem_is_reported_not_only_the_first() {
    let found = problems(
        "colour = 1\n[limits]\nmemory = \"2 gigs\"\npids = 0\n[security]\nprivileged = true\n",
    );
    assert_eq!(found.len(), 4, "{found:#?}");
    assert!(found[0].starts_with("p.toml:1:1: colour"));
    assert!(found[3].starts_with("p.toml:6:14: security.privileged"));
}

#[test]
fn extends_merges_field_by_field_and_servers_by_name() {
    let base = r#"
description = "base"
[limits]
memory = "1GiB"
pids = 10
[env]
set = { A = "1", B = "2" }
[[server]]
name = "one"
image = "one:1"
command = ["one"]
[[server]]
name = "two"
image = "two:1"
command = ["two"]
"#;
    let mid = "extends = \"base\"\n[limits]\npids = 20\n[env]\nset = { B = \"3\" }\n";
    let top = "extends = \"mid\"\ndescription = \"top\"\n[[server]]\nname = \"two\"\nimage = \"two:2\"\ncommand = [\"two\"]\n[[server]]\nname = \"three\"\nimage = \"three:1\"\ncommand = [\"three\"]\n";
    let profile = load(&[("base", base), ("mid", mid), ("top", top)], "top").unwrap();
    assert_eq!(profile.extends, vec!["mid".to_owned(), "base".to_owned()]);
    assert_eq!(profile.description, "top");
    assert_eq!(profile.limits.memory, ByteSize(1 << 30));
    assert_eq!(profile.limits.pids, 20);
    assert_eq!(profile.env.set.get("A").map(String::as_str), Some("1"));
    assert_eq!(profile.env.set.get("B").map(String::as_str), Some("3"));
    let servers: Vec<(&str, &str)> = profile
        .servers
        .iter()
        .map(|server| (server.name.as_str(), server.image.as_str()))
        .collect();
    assert_eq!(
        servers,
        vec![("one", "one:1"), ("two", "two:2"), ("three", "three:1")]
    );
}

#[test]
fn cycles_through_several_files_are_refused() {
    let error = load(
        &[
            ("a", "extends = \"b\"\n"),
            ("b", "extends = \"c\"\n"),
            ("c", "extends = \"a\"\n"),
        ],
        "a",
    )
    .unwrap_err();
    assert_eq!(error.problems.len(), 1);
    assert!(
        error.problems[0]
            .message
            .ends_with("makes a cycle: a → b → c → a"),
        "{error}"
    );
}

#[test]
fn an_error_in_a_parent_names_the_parent_file() {
    let error = load(
        &[
            ("parent", "[limits]\nmemory = \"lots\"\n"),
            ("child", "extends = \"parent\"\n"),
        ],
        "child",
    )
    .unwrap_err();
    assert!(
        error.problems[0].at.file.ends_with("parent.toml:2:10")
            || error.problems[0].to_string().contains("parent.toml:2:10"),
        "{error}"
    );
}

#[test]
fn a_profile_can_extend_the_one_it_hides() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("default.toml"),
        "extends = \"default\"\n[limits]\nmemory = \"1GiB\"\n",
    )
    .unwrap();
    let profile = Catalog::only(vec![dir.path().to_path_buf()])
        .load("default")
        .unwrap();
    assert_eq!(profile.limits.memory, ByteSize(1 << 30));
    assert_eq!(profile.env.pass, vec!["LANG".to_owned(), "TERM".to_owned()]);
    assert_eq!(profile.extends, vec!["default".to_owned()]);
    // Two directories: the first extends the second, which extends the shipped one.
    let first = tempfile::tempdir().unwrap();
    std::fs::write(
        first.path().join("ci.toml"),
        "extends = \"ci\"\n[limits]\npids = 100\n",
    )
    .unwrap();
    let second = tempfile::tempdir().unwrap();
    std::fs::write(
        second.path().join("ci.toml"),
        "extends = \"ci\"\n[limits]\nmemory = \"3GiB\"\n",
    )
    .unwrap();
    let catalog = Catalog::only(vec![
        first.path().to_path_buf(),
        second.path().to_path_buf(),
    ]);
    let profile = catalog.load("ci").unwrap();
    assert_eq!(
        (profile.limits.pids, profile.limits.memory),
        (100, ByteSize(3 << 30))
    );
    assert_eq!(
        profile.extends,
        vec!["ci".to_owned(), "ci".to_owned(), "default".to_owned()]
    );
}

#[test]
fn a_directory_profile_hides_a_shipped_one() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("default.toml"), "description = \"mine\"\n").unwrap();
    let catalog = Catalog::only(vec![dir.path().to_path_buf()]);
    assert_eq!(catalog.load("default").unwrap().description, "mine");
    let listed = catalog.list();
    let defaults: Vec<bool> = listed
        .iter()
        .filter(|entry| entry.name == "default")
        .map(|entry| entry.hidden)
        .collect();
    assert_eq!(defaults, vec![false, true]);
}

#[test]
fn unknown_names_and_path_like_names_are_refused() {
    let catalog = Catalog::only(Vec::new());
    assert_eq!(
        catalog.load("nope").unwrap_err().to_string(),
        "no profile named \"nope\"; known: ci, default, dev, fetch, no-fs, offline"
    );
    assert_eq!(
        catalog.load("../../etc/passwd").unwrap_err().to_string(),
        "\"../../etc/passwd\" is not a profile name; use letters, digits, -, _ and ., starting with a letter or digit"
    );
}

/// A README field table's rows: name, type and default, as written.
type Rows = Vec<(String, String, String)>;

/// The field tables of `profiles/README.md`, by section (the `### ` heading).
fn readme_tables(readme: &str) -> Vec<(String, Vec<Rows>)> {
    let mut sections: Vec<(String, Vec<Rows>)> = Vec::new();
    let mut in_table = false;
    for line in readme.lines() {
        if let Some(heading) = line.strip_prefix("### ") {
            sections.push((heading.to_owned(), Vec::new()));
            in_table = false;
        } else if line.starts_with("| field | type | default |") {
            if let Some((_, tables)) = sections.last_mut() {
                tables.push(Vec::new());
                in_table = true;
            }
        } else if in_table && line.starts_with("| ") {
            // Cells split at `|` not written `\|`.
            let mut cells = Vec::new();
            let mut cell = String::new();
            let mut escaped = false;
            for c in line.chars() {
                match c {
                    '|' if !escaped => cells.push(std::mem::take(&mut cell)),
                    _ => cell.push(c),
                }
                escaped = c == '\\';
            }
            let cell = |index: usize| cells.get(index).map_or("", |c| c.trim()).to_owned();
            let name = cell(1).trim_matches('`').to_owned();
            if let Some((_, tables)) = sections.last_mut()
                && let Some(table) = tables.last_mut()
            {
                table.push((name, cell(2), cell(3)));
            }
        } else if !line.starts_with("|-") {
            in_table = false;
        }
    }
    sections
}

/// The README's field tables say what `fields.rs` declares: every field of
/// every table, with its type and default, and no field it does not have.
#[test]
fn the_readme_documents_every_field_and_danger() {
    use super::fields::{FIELDS_OF, Limit, NETWORK, TABLES};
    let readme = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../profiles/README.md"
    ))
    .unwrap();
    let sections = readme_tables(&readme);
    let mut wrong = Vec::new();
    for table in TABLES {
        let (heading, index) = table.readme;
        let Some((_, tables)) = sections
            .iter()
            .find(|(title, _)| title.starts_with(heading))
        else {
            wrong.push(format!("no section `### {heading}`"));
            continue;
        };
        let Some(rows) = tables.get(index - 1) else {
            wrong.push(format!("no field table {index} under `### {heading}`"));
            continue;
        };
        for field in table.fields {
            if field.kind.starts_with("`[") {
                // A table of its own: documented by its section.
                if !sections
                    .iter()
                    .any(|(title, _)| title.starts_with(field.kind))
                {
                    wrong.push(format!("no section `### {}`", field.kind));
                }
                continue;
            }
            let path = format!("{}.{}", table.path, field.name);
            // A server's `network` and `limits` rows list their fields.
            let listed = |names: Vec<&str>| format!("`{{ {} }}`", names.join(", "));
            let declared = match (field.kind, field.name) {
                (FIELDS_OF, "network") => listed(NETWORK.names()),
                (FIELDS_OF, "limits") => listed(Limit::unit_names()),
                (FIELDS_OF, _) => format!("{FIELDS_OF} (which?)"),
                (kind, _) => kind.to_owned(),
            };
            match rows.iter().find(|(name, _, _)| name == field.name) {
                None => wrong.push(format!("{path}: no row")),
                Some((_, kind, default)) => {
                    if *kind != declared {
                        wrong.push(format!("{path}: type {kind:?}, declared {declared:?}"));
                    }
                    if default != field.default {
                        wrong.push(format!(
                            "{path}: default {default:?}, declared {:?}",
                            field.default
                        ));
                    }
                }
            }
        }
        for (name, _, _) in rows {
            if !table.fields.iter().any(|field| field.name == name) {
                wrong.push(format!("{}.{name}: a row for no field", table.path));
            }
        }
    }
    for danger in Danger::ALL {
        if !readme.contains(&format!("| `{}` |", danger.name())) {
            wrong.push(format!("danger {}: no row", danger.name()));
        }
    }
    for (name, _) in SHIPPED {
        if !readme.contains(&format!("| `{name}` |")) {
            wrong.push(format!("shipped profile {name}: no row"));
        }
    }
    assert!(
        wrong.is_empty(),
        "profiles/README.md does not say what fields.rs declares:\n{}",
        wrong.join("\n")
    );
}

/// A session may tighten exactly the fields of `[workspace]`, `[network]`
/// and `[limits]` that `fields.rs` says it may; of the others (and of every
/// field of a table a session cannot tighten) it is told they are the profile's.
#[test]
fn a_session_tightens_the_fields_declared_tightenable() {
    use super::fields::{LIFECYCLE, LIMITS, NETWORK, POOL, SECURITY, Tighten, WORKSPACE};
    let mut wrong = Vec::new();
    for table in [&WORKSPACE, &NETWORK, &LIMITS, &SECURITY, &LIFECYCLE, &POOL] {
        for field in table.fields {
            let ask = serde_json::json!({ table.path: { field.name: null } });
            let refused = match crate::plan::Tightening::parse(&ask) {
                Ok(_) => false,
                Err(error) => error.to_string().contains("which a session cannot tighten"),
            };
            if refused != (field.tighten == Tighten::No) {
                wrong.push(format!(
                    "{}.{} ({:?})",
                    table.path, field.name, field.tighten
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "tightening disagrees with fields.rs: {wrong:?}"
    );
}

/// The top level and `[env]` hold to their rows too: a table a session
/// narrows (`Within`) is a field of a tightening, a list of tables it drops
/// from (`Drop`) is one by its plural (`servers`), the rest are the
/// profile's; and every `[env]` field a row says a session drops from
/// (`Drop`) loses the variable a tightening's `env.drop` names.
#[test]
fn a_session_tightens_the_top_level_and_env_as_declared() {
    use super::fields::{ENV, TOP, Tighten};
    let mut wrong = Vec::new();
    for field in TOP.fields {
        let key = match field.tighten {
            Tighten::Drop => format!("{}s", field.name),
            _ => field.name.to_owned(),
        };
        let empty = match field.tighten {
            Tighten::Drop => serde_json::json!([]),
            _ => serde_json::json!({}),
        };
        let result = crate::plan::Tightening::parse(&serde_json::json!({ key.as_str(): empty }));
        let told_profiles = result
            .as_ref()
            .is_err_and(|error| error.to_string().contains("which a session cannot tighten"));
        let fits = match field.tighten {
            Tighten::No => told_profiles,
            Tighten::Within | Tighten::Drop => result.is_ok(),
            Tighten::AtMost | Tighten::Among => false,
        };
        if !fits {
            wrong.push(format!(
                "{} ({:?}) as {key}: {result:?}",
                field.name, field.tighten
            ));
        }
    }
    let text = "[env]\nset = { SET_VAR = \"1\" }\npass = [\"PASS_VAR\"]\nsecrets = [{ name = \"SECRET_VAR\", as_env = true }]\n";
    let profile = load(&[("p", text)], "p").unwrap();
    let tightening = crate::plan::Tightening::parse(&serde_json::json!({
        "env": {"drop": ["SET_VAR", "PASS_VAR", "SECRET_VAR"]}
    }))
    .unwrap();
    let narrowed = crate::plan::tighten(&profile, &tightening).unwrap();
    let left = |name: &str| -> Vec<String> {
        match name {
            "set" => narrowed.env.set.keys().cloned().collect(),
            "pass" => narrowed.env.pass.clone(),
            "secrets" => narrowed.env.secret_names(),
            _ => vec![format!("a field this test does not know: {name}")],
        }
    };
    for field in ENV.fields {
        let kept = left(field.name);
        if (field.tighten == Tighten::Drop) != kept.is_empty() {
            wrong.push(format!(
                "env.{} ({:?}) after env.drop: {kept:?}",
                field.name, field.tighten
            ));
        }
        let ask = serde_json::json!({ "env": { field.name: null } });
        let refused = crate::plan::Tightening::parse(&ask)
            .is_err_and(|error| error.to_string().contains("which a session cannot tighten"));
        if !refused {
            wrong.push(format!(
                "env.{}: a tightening names it, not env.drop",
                field.name
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "tightening disagrees with fields.rs: {wrong:?}"
    );
}

/// Every envelope key a field declares is where a plan gives the field to a unit.
#[test]
fn every_fields_envelope_key_is_in_the_plan() {
    use super::fields::{TABLES, Table};
    let text = "[workspace]\nruntime = \"runsc\"\nlocal_userland = \"host\"\npull = \"always\"\npull_secret = \"AUTH\"\n\
                [network]\nmode = \"egress\"\nallow = [\"example.com\"]\nhosts = { \"example.com\" = \"10.0.0.1\" }\nmax_connections = 8\nbandwidth = \"1MiB\"\n\
                [env]\nsecrets = [{name = \"TOKEN\", as_env = true}]\n\
                [[volume]]\nname = \"cache\"\npath = \"~/.cache\"\n\
                [[server]]\nname = \"s\"\nimage = \"box-fetch:latest\"\ncommand = [\"s\"]\nruntime = \"runsc\"\npull = \"never\"\npull_secret = \"AUTH\"\nlocal_userland = \"host\"\n\
                [operator]\nallow_dangerous = [\"private-destinations\"]\n";
    let profile = load(&[("p", text)], "p").unwrap();
    let plan = crate::plan::resolve(
        &profile,
        &serde_json::Value::Null,
        &crate::plan::HostFacts::fixed(),
    )
    .unwrap()
    .to_json();
    let has = |unit: &serde_json::Value, key: &str| {
        key.split('.')
            .try_fold(unit, |value, part| {
                let value = value.get(0).unwrap_or(value);
                value.get(part)
            })
            .is_some()
    };
    let units = &plan["units"];
    let mut missing = Vec::new();
    for table in TABLES {
        let unit: &Table = table;
        let in_unit = if unit.path == "server" {
            &units[1]
        } else {
            &units[0]
        };
        for field in unit.fields {
            if let Some(key) = field.envelope
                && !has(in_unit, key)
            {
                missing.push(format!("{}.{} as {key}", unit.path, field.name));
            }
        }
    }
    assert!(missing.is_empty(), "not in the plan: {missing:?}\n{plan:#}");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    /// Whatever a profile file holds, loading answers with a profile or located problems; it never panics.
    #[test]
    fn any_profile_text_is_answered(text in "(\\[[a-z]{0,9}\\]\n|[a-z_]{1,12} = (\"[a-z0-9 :/.]{0,12}\"|-?[0-9]{1,4}|true|\\[\\]|\\{\\})\n|#.*\n){0,12}") {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("p.toml"), &text).unwrap();
        match Catalog::only(vec![dir.path().to_path_buf()]).load("p") {
            Ok(profile) => proptest::prop_assert_eq!(profile.name, "p"),
            Err(error) => proptest::prop_assert!(!error.problems.is_empty()),
        }
    }
}

/// Issue 8, item 4: with a `cwd` source (written or by default) the danger is
/// judged where `cwd` resolves, so allowing `host-root` or `docker-socket`
/// there is not an unused allowance; with a harmless fixed path it still is.
#[test]
fn a_cwd_source_may_carry_the_workspace_allowances() {
    for text in ["", "[workspace]\nsource = \"cwd\"\n"] {
        let allowed =
            format!("{text}[operator]\nallow_dangerous = [\"host-root\", \"docker-socket\"]\n");
        let profile = load(&[("p", &allowed)], "p").unwrap();
        assert_eq!(
            profile.dangerous,
            vec![Danger::DockerSocket, Danger::HostRoot],
            "{text:?}"
        );
    }
    assert_eq!(
        problems("[workspace]\nsource = \"/srv/repo\"\n[operator]\nallow_dangerous = [\"host-root\"]\n"),
        vec!["p.toml:4:20: operator.allow_dangerous: allows \"host-root\" but the profile does not ask for it; remove it".to_owned()]
    );
}

#[test]
fn secrets_are_names_or_tables_asking_for_a_variable_too() {
    let text = "[env]\nsecrets = [\"DEPLOY_KEY\", {name = \"GH_TOKEN\", as_env = true}, {name = \"NPM_TOKEN\"}]\n\
                [workspace]\non_persisted_credentials = \"refuse\"\n";
    let profile = load(&[("p", text)], "p").unwrap();
    assert_eq!(
        profile.env.secret_names(),
        ["DEPLOY_KEY", "GH_TOKEN", "NPM_TOKEN"]
    );
    assert_eq!(profile.env.secrets_as_env(), ["GH_TOKEN"]);
    assert_eq!(
        profile.workspace.on_persisted_credentials,
        super::OnPersisted::Refuse
    );
    assert_eq!(
        problems("[env]\nsecrets = [{as_env = true}]\n"),
        [
            "p.toml:2:12: env.secrets: a table entry needs `name`, like {name = \"GITHUB_TOKEN\", as_env = true}"
        ]
    );
    assert_eq!(
        problems("[env]\nsecrets = [{name = \"A\", as_env = \"yes\"}]\n"),
        ["p.toml:2:34: env.secrets.as_env: expected true or false, got \"yes\" (a string)"]
    );
    assert_eq!(
        problems("[env]\nsecrets = [{name = \"A\", file = true}]\n"),
        ["p.toml:2:25: env.secrets.file: unknown field; accepted here: name, as_env"]
    );
    assert_eq!(
        problems("[workspace]\non_persisted_credentials = \"mask\"\n"),
        [
            "p.toml:2:28: workspace.on_persisted_credentials: \"mask\" is not accepted; write \"report\", \"refuse\" or \"hide\""
        ]
    );
}

/// Issue 10: an egress unit's proxy settings: pinned hosts, limits, wildcards; each
/// refused outside `egress`, and bad values named.
#[test]
fn egress_settings_are_read_and_only_with_egress() {
    let profile = load(
        &[(
            "p",
            "description = \"x\"\n[network]\nmode = \"egress\"\nallow = [\"*.example.com\", \"registry.internal:5000\"]\nhosts = { \"registry.internal\" = \"10.0.0.5\" }\nmax_connections = 8\nbandwidth = \"1MiB\"\n[operator]\nallow_dangerous = [\"private-destinations\"]\n",
        )],
        "p",
    )
    .unwrap();
    assert_eq!(profile.network.max_connections, Some(8));
    assert_eq!(profile.network.bandwidth, Some(ByteSize(1 << 20)));
    assert_eq!(
        profile.network.hosts["registry.internal"],
        "10.0.0.5".parse::<std::net::IpAddr>().unwrap()
    );
    assert_eq!(profile.dangerous, vec![Danger::PrivateDestinations]);
    for (text, expected) in [
        (
            "[network]\nmode = \"none\"\nmax_connections = 8\n",
            "network.max_connections: only applies to mode \"egress\"",
        ),
        (
            "[network]\nmode = \"egress\"\nallow = [\"a.test\"]\nhosts = { \"a.test\" = \"not-an-ip\" }\n",
            "network.hosts.a.test: \"not-an-ip\" is not an IP address",
        ),
        (
            "[network]\nmode = \"egress\"\nallow = [\"a.test\"]\nhosts = { \"*.a.test\" = \"10.0.0.1\" }\n",
            "is not a host name",
        ),
        (
            "[network]\nmode = \"egress\"\nallow = [\"a.test\"]\nmax_connections = 0\n",
            "network.max_connections",
        ),
        (
            "[network]\nmode = \"none\"\n[operator]\nallow_dangerous = [\"private-destinations\"]\n",
            "allows \"private-destinations\" but the profile does not ask for it",
        ),
    ] {
        let found = problems(text);
        assert!(
            found.iter().any(|problem| problem.contains(expected)),
            "{text}: {found:?}"
        );
    }
}

/// Issue 22, item 4: `local_userland` is read per unit, refused when it is
/// neither word, and goes with the `image` beside it through `extends`.
#[test]
fn local_userland_goes_with_its_image() {
    use crate::plan::LocalUserland::{Host, Refuse};
    let minimal = load(&[("p", "description = \"x\"\n")], "p").unwrap();
    assert_eq!(minimal.workspace.local_userland, Refuse);
    let shipped = Catalog::only(Vec::new());
    for name in ["default", "ci", "offline", "fetch", "dev"] {
        let profile = shipped.load(name).unwrap();
        assert_eq!(profile.workspace.local_userland, Host, "{name}");
    }
    assert_eq!(
        shipped.load("fetch").unwrap().servers[0].local_userland,
        Refuse
    );
    let pin = "img@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    let userland_of = |child: &str| {
        let profile = load(&[("p", child)], "p").unwrap();
        profile.workspace.local_userland
    };
    // The parent's leave was for its image: a child with its own loses it...
    assert_eq!(
        userland_of(&format!(
            "extends = \"default\"\n[workspace]\nimage = \"{pin}\"\n"
        )),
        Refuse
    );
    // ...unless it says so again, and one that keeps the image keeps it.
    assert_eq!(
        userland_of(&format!(
            "extends = \"default\"\n[workspace]\nimage = \"{pin}\"\nlocal_userland = \"host\"\n"
        )),
        Host
    );
    assert_eq!(
        userland_of("extends = \"default\"\n[workspace]\nmode = \"ro\"\n"),
        Host
    );
    assert_eq!(
        userland_of("extends = \"default\"\n[workspace]\nlocal_userland = \"refuse\"\n"),
        Refuse
    );
    let server = load(
        &[(
            "p",
            "[[server]]\nname = \"echo\"\nimage = \"box-base:bookworm\"\ncommand = [\"cat\"]\nlocal_userland = \"host\"\n",
        )],
        "p",
    )
    .unwrap();
    assert_eq!(server.servers[0].local_userland, Host);
    for (text, expected) in [
        (
            "[workspace]\nlocal_userland = \"image\"\n",
            "p.toml:2:18: workspace.local_userland: \"image\" is not accepted; write \"refuse\" or \"host\"",
        ),
        (
            "[workspace]\nlocal_userland = true\n",
            "p.toml:2:18: workspace.local_userland: expected \"refuse\" or \"host\", got true (a boolean)",
        ),
        (
            "[[server]]\nname = \"echo\"\nimage = \"i:1\"\ncommand = [\"cat\"]\nlocal_userland = \"yes\"\n",
            "p.toml:5:18: server[echo].local_userland: \"yes\" is not accepted; write \"refuse\" or \"host\"",
        ),
    ] {
        assert_eq!(problems(text), vec![expected.to_owned()], "{text}");
    }
}

/// Issue 23, item 2: `/tmp` is executable unless `[security] tmp` says
/// `noexec`; the plan carries the choice.
#[test]
fn tmp_is_executable_unless_the_profile_says_noexec() {
    use crate::plan::TmpMode;
    let minimal = load(&[("p", "description = \"x\"\n")], "p").unwrap();
    assert_eq!(minimal.security.tmp, TmpMode::Exec);
    let strict = load(&[("p", "[security]\ntmp = \"noexec\"\n")], "p").unwrap();
    assert_eq!(strict.security.tmp, TmpMode::NoExec);
    let plan = crate::plan::resolve(
        &strict,
        &serde_json::Value::Null,
        &crate::plan::HostFacts::fixed(),
    )
    .unwrap();
    assert_eq!(plan.units[0].security.tmp, TmpMode::NoExec);
    assert_eq!(plan.to_json()["units"][0]["security"]["tmp"], "noexec");
    assert_eq!(
        problems("[security]\ntmp = \"nosuid\"\n"),
        vec![
            "p.toml:2:7: security.tmp: \"nosuid\" is not accepted; write \"exec\" or \"noexec\""
                .to_owned()
        ]
    );
}

/// Issue 23, item 4: `[[volume]]` tables are read (a path beneath the home
/// or an absolute one, a scope), merge by name through `extends`, and
/// reach the workspace unit's plan; a session can drop one, never add one.
#[test]
fn volumes_are_read_merged_and_only_dropped() {
    use crate::plan::{Volume, VolumePath, VolumeScope};
    let parent = "[[volume]]\nname = \"pip\"\npath = \"~/.cache/pip\"\nscope = \"profile\"\n\
                  [[volume]]\nname = \"scratch\"\npath = \"/var/cache/box/scratch\"\n";
    let child = "extends = \"parent\"\n[[volume]]\nname = \"pip\"\npath = \"~/.cache/pip2\"\n";
    let profile = load(&[("parent", parent), ("p", child)], "p").unwrap();
    assert_eq!(
        profile.volumes,
        vec![
            Volume {
                scope: VolumeScope::Session,
                ..Volume::new(
                    "pip".to_owned(),
                    VolumePath::Home(PathBuf::from(".cache/pip2"))
                )
            },
            Volume {
                scope: VolumeScope::Session,
                ..Volume::new(
                    "scratch".to_owned(),
                    VolumePath::Absolute(PathBuf::from("/var/cache/box/scratch"))
                )
            },
        ]
    );
    let host = crate::plan::HostFacts::fixed();
    let plan = crate::plan::resolve(&profile, &serde_json::Value::Null, &host).unwrap();
    assert_eq!(plan.units[0].volumes, profile.volumes);
    assert_eq!(
        plan.to_json()["units"][0]["volumes"][0],
        serde_json::json!({"name": "pip", "path": "~/.cache/pip2", "scope": "session"})
    );
    let kept = crate::plan::resolve(
        &profile,
        &serde_json::json!({"volumes": ["scratch"]}),
        &host,
    )
    .unwrap();
    assert_eq!(kept.units[0].volumes, profile.volumes[1..].to_vec());
    assert!(kept.is_within(&plan));
    assert_eq!(
        crate::plan::resolve(&profile, &serde_json::json!({"volumes": ["extra"]}), &host)
            .unwrap_err()
            .to_string(),
        "tighten.volumes: asked for \"extra\", but profile `p` allows at most [pip, scratch]"
    );
}

/// Issue 23, item 4: a volume's name and path are checked: nothing in or
/// around the kernel's places, box's own, /tmp, the secrets, the workspace
/// or another volume.
#[test]
fn a_volume_goes_only_where_it_makes_sense() {
    let volume = |path: &str| format!("[[volume]]\nname = \"v\"\npath = \"{path}\"\n");
    for (text, expected) in [
        (volume("relative/x"), "\"relative/x\" is not accepted; write \"~/\""),
        (volume("~/../x"), "\"~/../x\" is not a path beneath the home"),
        (volume("~/"), "\"~/\" is not a path beneath the home"),
        (volume("/"), "\"/\" is not accepted"),
        (volume("/proc/x"), "\"/proc/x\" is, or is inside or around, the kernel's /proc"),
        (volume("/.box/v"), "is, or is inside or around, box's own /.box"),
        (volume("/tmp/cache"), "is, or is inside or around, the unit's own /tmp"),
        (volume("/run"), "\"/run\" is, or is inside or around, /run/secrets, where"),
        (volume("/workspace/cache"), "\"/workspace/cache\" overlaps the workspace at /workspace"),
        (volume("/srv"), "overlaps"),
        (
            "[[volume]]\nname = \"Pip\"\npath = \"~/p\"\n".to_owned(),
            "\"Pip\" is not a volume name",
        ),
        (
            "[[volume]]\nname = \"a\"\npath = \"~/.cargo\"\n[[volume]]\nname = \"b\"\npath = \"~/.cargo/registry\"\n".to_owned(),
            "overlaps volume \"a\" at ~/.cargo",
        ),
        (
            "[[volume]]\nname = \"a\"\npath = \"~/a\"\n[[volume]]\nname = \"a\"\npath = \"~/b\"\n".to_owned(),
            "a volume named \"a\" is declared twice",
        ),
        (
            "[[volume]]\nname = \"a\"\npath = \"~/a\"\nscope = \"host\"\n".to_owned(),
            "\"host\" is not accepted; write \"session\" or \"profile\"",
        ),
        (
            "[workspace]\nsource = \"none\"\n[[volume]]\nname = \"a\"\npath = \"~/a\"\n".to_owned(),
            "source = \"none\" has none",
        ),
    ] {
        let text = if text.contains("/srv") {
            "[workspace]\nroot = \"/srv/ws\"\n[[volume]]\nname = \"v\"\npath = \"/srv\"\n".to_owned()
        } else {
            text
        };
        let found = problems(&text);
        assert!(
            found.iter().any(|problem| problem.contains(expected)),
            "{text}: {found:?}"
        );
    }
}
