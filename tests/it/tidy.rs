//! Tidy checks: the documentation map stays true to the code.

use crate::support::repo_root;

#[test]
fn architecture_names_every_module() {
    let root = repo_root();
    let map = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(root.join("src")).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        let module = name.trim_end_matches(".rs");
        if module == "lib" || module == "main" {
            continue;
        }
        if !map.contains(&format!("`{module}/`")) && !map.contains(&format!("`{module}.rs`")) {
            missing.push(module.to_owned());
        }
    }
    for entry in std::fs::read_dir(root.join("crates")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if !map.contains(&format!("`{name}`")) {
            missing.push(format!("crates/{name}"));
        }
    }
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md's code map does not name: {missing:?}"
    );
}

/// The workspace's dependency graph is the architecture (ARCHITECTURE.md,
/// "Crates"): each member may depend only on the members listed for it, the
/// libraries that define a boundary (bollard, axum, hyper, rmcp, clap) are
/// each a dependency of exactly one member, the test doubles are never a
/// normal dependency (but of `box-testhost`, the test-only binary), and
/// `box-testkit` never depends on the root package, so testing one crate with
/// the fake does not build all of box.
#[test]
fn crates_depend_only_on_what_the_architecture_allows() {
    // member -> the workspace members it may depend on (normal dependencies).
    let allowed: &[(&str, &[&str])] = &[
        ("box-policy", &[]),
        ("box-jsonrpc", &[]),
        ("box-scrub", &["box-policy"]),
        ("box-confine", &["box-policy"]),
        ("box-redact", &[]),
        ("box-egress", &["box-policy"]),
        ("box-fork", &["box-scrub"]),
        ("box-init", &[]),
        // OpenTelemetry in one place, a leaf: the executor records its spans
        // with it (ids and times), the host exports them; neither knows OTLP.
        ("box-otel", &[]),
        (
            "box-executor",
            &[
                "box-policy",
                "box-jsonrpc",
                "box-scrub",
                "box-confine",
                "box-egress",
                "box-otel",
            ],
        ),
        ("box-backend", &["box-policy", "box-scrub", "box-init"]),
        (
            "box-backend-docker",
            &["box-backend", "box-policy", "box-confine", "box-init"],
        ),
        (
            "box-backend-local",
            &[
                "box-backend",
                "box-policy",
                "box-confine",
                "box-scrub",
                "box-init",
            ],
        ),
        (
            "box-host",
            &[
                "box-policy",
                "box-backend",
                "box-jsonrpc",
                "box-scrub",
                "box-redact",
                "box-egress",
                "box-fork",
                "box-otel",
            ],
        ),
        ("box-transport", &["box-jsonrpc"]),
    ];
    // A library that marks a boundary -> the one member that may use it.
    let exclusive: &[(&str, &str)] = &[
        ("bollard", "box-backend-docker"),
        ("axum", "box-transport"),
        ("hyper", "box-transport"),
        ("hyper-util", "box-transport"),
        ("rmcp", "box-executor"),
        ("clap", "boxhost"),
    ];
    let output = std::process::Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(repo_root())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let packages = metadata["packages"].as_array().unwrap();
    let members: Vec<&str> = packages
        .iter()
        .filter_map(|package| package["name"].as_str())
        .collect();
    let mut wrong = Vec::new();
    let mut users: std::collections::BTreeMap<&str, Vec<String>> = Default::default();
    for package in packages {
        let name = package["name"].as_str().unwrap();
        for dependency in package["dependencies"].as_array().unwrap() {
            let target = dependency["name"].as_str().unwrap();
            let dev = dependency["kind"].as_str() == Some("dev");
            if let Some((_, owner)) = exclusive.iter().find(|(lib, _)| *lib == target) {
                users.entry(target).or_default().push(name.to_owned());
                if name != *owner {
                    wrong.push(format!(
                        "{name} depends on {target}, which only {owner} may use"
                    ));
                }
            }
            if target == "boxhost" && name == "box-testkit" {
                wrong.push(
                    "box-testkit depends on boxhost: testing any crate with the fake would build all of box (box's command line with the fake is box-testhost's)".to_owned(),
                );
            }
            if target == "box-testkit" && !dev && name != "box-testhost" {
                wrong.push(format!(
                    "{name} depends on box-testkit outside its dev-dependencies"
                ));
            }
            if dev || !members.contains(&target) {
                continue;
            }
            match allowed.iter().find(|(member, _)| *member == name) {
                Some((_, may)) if !may.contains(&target) => {
                    wrong.push(format!(
                        "{name} must not depend on {target} (allowed: {may:?})"
                    ));
                }
                // The binary wires everything; the test kit and the test host may use anything.
                None if !["boxhost", "box-testkit", "box-testhost"].contains(&name) => {
                    wrong.push(format!("{name} is not in the architecture's table"));
                }
                _ => {}
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "the crate graph breaks the architecture:\n{}",
        wrong.join("\n")
    );
    for (lib, owner) in exclusive {
        assert_eq!(
            users.get(lib).cloned().unwrap_or_default(),
            [owner.to_string()],
            "{lib} must be a dependency of {owner} alone"
        );
    }
}

/// Every member's manifest takes the workspace's lints (`[lints] workspace =
/// true`) and each dependency's version from `[workspace.dependencies]`
/// (`dep.workspace = true`, features added as needed), so one version of each
/// library is built and one set of lints holds; and no manifest but
/// box-backend-docker's lists bollard (the others reach it through
/// `box_backend_docker::bollard`).
#[test]
fn manifests_take_the_workspaces_lints_and_versions() {
    // Members that keep lints of their own, each with why. None today: a
    // crate's stricter lints (box-egress's `forbid(unsafe_code)`) are crate
    // attributes in its lib.rs.
    const OWN_LINTS: &[(&str, &str)] = &[];
    let root = repo_root();
    let mut manifests = vec![root.join("Cargo.toml")];
    for entry in std::fs::read_dir(root.join("crates")).unwrap() {
        manifests.push(entry.unwrap().path().join("Cargo.toml"));
    }
    manifests.sort();
    let mut wrong = Vec::new();
    for path in &manifests {
        let shown = path.strip_prefix(&root).unwrap().display();
        let manifest: toml::Table = std::fs::read_to_string(path).unwrap().parse().unwrap();
        let name = manifest["package"]["name"].as_str().unwrap();
        let workspace_lints = manifest
            .get("lints")
            .and_then(|lints| lints.get("workspace"))
            .and_then(toml::Value::as_bool)
            == Some(true);
        if !workspace_lints && !OWN_LINTS.iter().any(|(member, _)| *member == name) {
            wrong.push(format!(
                "{shown}: write [lints] workspace = true (a stricter lint goes in lib.rs as #![...])"
            ));
        }
        let kinds = ["dependencies", "dev-dependencies", "build-dependencies"];
        let mut tables: Vec<(String, &toml::Table)> = kinds
            .iter()
            .filter_map(|kind| Some((kind.to_string(), manifest.get(*kind)?.as_table()?)))
            .collect();
        for (cfg, target) in manifest
            .get("target")
            .and_then(toml::Value::as_table)
            .into_iter()
            .flatten()
        {
            for kind in kinds {
                if let Some(table) = target.get(kind).and_then(toml::Value::as_table) {
                    tables.push((format!("target.{cfg}.{kind}"), table));
                }
            }
        }
        for (kind, table) in tables {
            for (dependency, spec) in table {
                if dependency == "bollard" && name != "box-backend-docker" {
                    wrong.push(format!(
                        "{shown}: [{kind}] lists bollard, which only box-backend-docker may; use box_backend_docker::bollard"
                    ));
                }
                if spec.get("workspace").and_then(toml::Value::as_bool) != Some(true) {
                    wrong.push(format!(
                        "{shown}: [{kind}] {dependency} has a version of its own; write {dependency}.workspace = true (add it to [workspace.dependencies] first)"
                    ));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "manifests that leave the workspace's settings:\n{}",
        wrong.join("\n")
    );
}

/// README prose is one sentence (or clause) per line, so no line runs past a
/// screen in an editor or a diff; code blocks and tables are left as they are.
#[test]
fn readme_prose_lines_fit_a_screen() {
    const WIDTH: usize = 400;
    let readme = std::fs::read_to_string(crate::support::repo_root().join("README.md")).unwrap();
    let mut fenced = false;
    let long: Vec<String> = readme
        .lines()
        .enumerate()
        .filter(|(_, line)| {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced && !line.trim_start().starts_with('|') && line.chars().count() > WIDTH
        })
        .map(|(n, line)| format!("README.md:{}: {} characters", n + 1, line.chars().count()))
        .collect();
    assert!(
        long.is_empty(),
        "split these lines (at a sentence or a `;`):\n{}",
        long.join("\n")
    );
}

/// Examples name placeholder domains, never a real public package registry's host.
#[test]
fn docs_name_no_public_registry_hosts() {
    const HOSTS: &[&str] = &[
        "crates.io",
        "pypi.org",
        "pythonhosted.org",
        "registry.npmjs.org",
        "proxy.golang.org",
        "github.com",
        "docs.rs",
        "python.org",
    ];
    let root = crate::support::repo_root();
    let mut files = vec![root.join("README.md")];
    for dir in ["docs", "profiles"] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "md" || e == "toml") {
                files.push(path);
            }
        }
    }
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            for host in HOSTS {
                if line.contains(host) {
                    found.push(format!("{}:{}: {host}", file.display(), n + 1));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "use example.com / example.org instead:\n{}",
        found.join("\n")
    );
}

/// The commands write their output through `outln!`/`out!` (`cli/out.rs`),
/// which end quietly on a closed pipe; `println!` would panic there.
#[test]
fn commands_never_print_with_println() {
    let dir = repo_root().join("src/cli");
    let mut found = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().is_some_and(|name| name == "out.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for (number, line) in text.lines().enumerate() {
            let code = line.replace("eprintln!(", "").replace("eprint!(", "");
            if code.contains("println!(") || code.contains("print!(") {
                found.push(format!(
                    "{}:{}: {}",
                    path.display(),
                    number + 1,
                    line.trim()
                ));
            }
        }
    }
    assert!(
        found.is_empty(),
        "use outln!/out! (src/cli/out.rs) instead:\n{}",
        found.join("\n")
    );
}

/// The production code of the files under `dir` (everything before a file's
/// first `#[cfg(test)]`; `tests.rs` files are test code), by path.
fn production_code(dir: &std::path::Path) -> Vec<(std::path::PathBuf, String)> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_owned()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs")
                && path.file_name().is_some_and(|name| name != "tests.rs")
            {
                let text = std::fs::read_to_string(&path).unwrap();
                let production = match text.find("#[cfg(test)]") {
                    Some(at) => text[..at].to_owned(),
                    None => text,
                };
                files.push((path, production));
            }
        }
    }
    files.sort();
    files
}

/// Each production line under `dir` (a path in the repository; the files
/// `skip` names left out) that `said` has something to say of, as
/// `PATH:LINE: SAID`.
fn production_lines(
    dir: &str,
    skip: impl Fn(&std::path::Path) -> bool,
    said: impl Fn(&str) -> Option<String>,
) -> Vec<String> {
    let root = repo_root();
    let mut found = Vec::new();
    for (path, code) in production_code(&root.join(dir)) {
        if skip(&path) {
            continue;
        }
        for (number, line) in code.lines().enumerate() {
            if let Some(said) = said(line) {
                found.push(format!(
                    "{}:{}: {said}",
                    path.strip_prefix(&root).unwrap_or(&path).display(),
                    number + 1
                ));
            }
        }
    }
    found
}

/// A tidy rule holds: nothing was `found`; else the failure says what to do
/// `instead` and lists it.
#[track_caller]
fn none_of(found: &[String], instead: &str) {
    assert!(found.is_empty(), "{instead}:\n{}", found.join("\n"));
}

/// The crates whose production files (the lines before a file's
/// `#[cfg(test)]`) are held under 1,000 lines, each with why it can be:
/// a file that outgrows this holds two things that change for different
/// reasons.
const HELD_UNDER_A_THOUSAND_LINES: &[(&str, &str)] = &[
    (
        "box-host",
        "the session task is a handshake, a method table and a routing loop, each in a file of its own (ARCHITECTURE.md, `box-host`)",
    ),
    (
        "box-backend-docker",
        "a backend's start, adopt, envelope and end are files of their own",
    ),
    (
        "box-backend-local",
        "a backend's start, adopt, envelope and end are files of their own",
    ),
    (
        "box-executor",
        "the bash analysis is its subset lexer, read-only checks, globs, git probe and splitter in files of their own (ARCHITECTURE.md, `box-executor`), and the process methods, the tools and the workspace each hold one thing",
    ),
    (
        "box-transport",
        "HTTP is the router and its shared types in `http.rs`, with the request checks, the handshake era's endpoints, the stateless revision, answering (JSON/SSE) and the probes in files of their own under `http/` (ARCHITECTURE.md, `box-transport`)",
    ),
];

/// No production file of a crate of [`HELD_UNDER_A_THOUSAND_LINES`] is over
/// 1,000 lines; a failure names each file over, its crate and why that
/// crate can keep under.
#[test]
fn production_files_stay_under_a_thousand_lines() {
    const MOST: usize = 1_000;
    let root = repo_root();
    let mut long = Vec::new();
    for (name, why) in HELD_UNDER_A_THOUSAND_LINES {
        for (path, code) in production_code(&root.join("crates").join(name).join("src")) {
            let lines = code.lines().count();
            if lines > MOST {
                long.push(format!(
                    "{name}: {}: {lines} lines before #[cfg(test)] ({why})",
                    path.strip_prefix(&root).unwrap_or(&path).display(),
                ));
            }
        }
    }
    assert!(
        long.is_empty(),
        "split these files by what they own (at most {MOST} production lines each):\n{}",
        long.join("\n")
    );
}

/// The host keeps no process-wide state: what its sessions share is the
/// `Services` value the host owns (the egress proxies' runtime among it), so
/// two hosts in one process share nothing and a host's state ends with it.
#[test]
fn box_host_has_no_static_state() {
    let found = production_lines(
        "crates/box-host/src",
        |_| false,
        |line| {
            let line = line.trim_start();
            let declared = line
                .strip_prefix("pub ")
                .or_else(|| line.strip_prefix("pub(crate) "))
                .unwrap_or(line);
            (declared.starts_with("static ")
                || line.contains("LazyLock")
                || line.contains("thread_local!"))
            .then(|| line.to_owned())
        },
    );
    none_of(&found, "keep it in the host's `Services` instead");
}

/// The process around the host is the binary's (`src/process.rs`,
/// `src/run.rs`): the host library installs no logger or signal handler,
/// touches no terminal and never exits the process.
#[test]
fn box_host_sets_up_no_process() {
    const PROCESS: &[&str] = &[
        "tracing_subscriber",
        "tokio::signal",
        "termios",
        "process::exit",
    ];
    let found = production_lines(
        "crates/box-host/src",
        |_| false,
        |line| {
            PROCESS
                .iter()
                .find(|what| line.contains(*what))
                .map(|what| (*what).to_owned())
        },
    );
    none_of(&found, "this belongs to the binary (src/process.rs)");
}

/// A unit's life over box-init's channel is driven in one place,
/// `box_backend::lifecycle` (ARCHITECTURE.md, `box-backend`): no backend
/// renews a lease, fences off an earlier host or takes a channel apart
/// itself, so the docker and local backends cannot drift apart again and a
/// new backend reuses what they use.
#[test]
fn only_box_backends_lifecycle_drives_a_units_channel() {
    const DRIVING: &[&str] = &[
        "renew_interval(",
        "renew_confirmed(",
        ".renew(",
        "UnitChannel {",
    ];
    let root = repo_root();
    let lifecycle = root.join("crates/box-backend/src/lifecycle.rs");
    let init = root.join("crates/box-init");
    let mut found = Vec::new();
    for dir in ["crates", "src"] {
        found.extend(production_lines(
            dir,
            |path| path == lifecycle || path.starts_with(&init),
            |line| {
                DRIVING
                    .iter()
                    .any(|driving| line.contains(driving))
                    .then(|| line.trim().to_owned())
            },
        ));
    }
    none_of(
        &found,
        "use box_backend::lifecycle (accept, reconnect, relay) instead",
    );
}

/// Backends are registered, not enumerated: the commands (`box units`,
/// `box gc`, `box doctor`, the completions) take them from the binary's
/// `Registry` (`src/backends.rs`), so a new backend is one crate and one
/// registration, and no list of backend names is written out by hand.
#[test]
fn the_commands_list_backends_from_the_registry() {
    let found = production_lines(
        "src",
        |_| false,
        |line| {
            let compact: String = line.chars().filter(|c| !c.is_whitespace()).collect();
            (compact.contains("\"docker\",\"local\"") || compact.contains("\"local\",\"docker\""))
                .then(|| line.trim().to_owned())
        },
    );
    none_of(
        &found,
        "take the backends from crate::backends::registry() instead",
    );
}

/// The modules a path names after `prefix::` in `code`: `crate::units::X`
/// names `units`, `crate::{audit, egress::EgressProxy}` names both. Comments
/// (doc links among them) name nothing.
fn named_after(code: &str, prefix: &str) -> Vec<String> {
    let code: String = code
        .lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let word = |text: &str| -> String {
        text.trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut names = Vec::new();
    let needle = format!("{prefix}::");
    for (at, _) in code.match_indices(&needle) {
        // `box_host::x` or `self::super::x` is not this prefix.
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let rest = &code[at + needle.len()..];
        match rest.strip_prefix('{') {
            Some(group) => {
                // The group's items at its own depth.
                let mut depth = 0;
                let mut item = String::new();
                for c in group.chars() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => break,
                        '}' => depth -= 1,
                        ',' if depth == 0 => names.push(word(&std::mem::take(&mut item))),
                        _ if depth == 0 => item.push(c),
                        _ => {}
                    }
                }
                names.push(word(&item));
            }
            None => names.push(word(rest)),
        }
    }
    names.retain(|name| !name.is_empty());
    names
}

/// A cycle in `edges` (module → modules it imports, with the file that does),
/// as `a -> b (file) -> a`, if there is one.
fn a_cycle(edges: &std::collections::BTreeMap<String, Vec<(String, String)>>) -> Option<String> {
    fn visit(
        node: &str,
        edges: &std::collections::BTreeMap<String, Vec<(String, String)>>,
        path: &mut Vec<(String, String)>,
        done: &mut std::collections::BTreeSet<String>,
    ) -> Option<String> {
        if let Some(start) = path.iter().position(|(seen, _)| seen == node) {
            let cycle: Vec<String> = path[start..]
                .iter()
                .map(|(module, file)| format!("{module} ({file})"))
                .collect();
            return Some(format!("{} -> {node}", cycle.join(" -> ")));
        }
        if !done.insert(node.to_owned()) {
            return None;
        }
        for (next, file) in edges.get(node).into_iter().flatten() {
            path.push((node.to_owned(), file.clone()));
            let found = visit(next, edges, path, done);
            path.pop();
            if found.is_some() {
                return found;
            }
        }
        None
    }
    let mut done = std::collections::BTreeSet::new();
    edges
        .keys()
        .find_map(|node| visit(node, edges, &mut Vec::new(), &mut done))
}

/// No import loop between sibling modules of the host (ARCHITECTURE.md,
/// `box-host`: imports point one way): between the files of
/// `crates/box-host/src` (`crate::NAME`, a name `lib.rs` re-exports counted
/// as its module's), and between the files of one folder there
/// (`super::NAME`, the folder's own module excepted: a child may use its
/// parent). Production code only; `lib.rs` is the root every module hangs from.
#[test]
fn box_host_modules_import_no_loops() {
    use std::collections::BTreeMap;
    let root = repo_root();
    let src = root.join("crates/box-host/src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    // `pub use config::{HostConfig, ...};`: each name is its module's.
    let mut owner: BTreeMap<String, String> = BTreeMap::new();
    for line in lib.lines() {
        if let Some(rest) = line.strip_prefix("pub use ")
            && let Some((module, names)) = rest.split_once("::")
        {
            for name in names.split(|c: char| !(c.is_alphanumeric() || c == '_')) {
                owner.insert(name.to_owned(), module.to_owned());
            }
        }
    }
    let mut crate_edges: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    let mut folder_edges: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    let mut modules = std::collections::BTreeSet::new();
    let files = production_code(&src);
    for (path, _) in &files {
        let relative = path.strip_prefix(&src).unwrap();
        if relative.components().count() == 1 {
            modules.insert(relative.file_stem().unwrap().to_string_lossy().into_owned());
        }
    }
    for (path, code) in &files {
        let relative = path.strip_prefix(&src).unwrap();
        let shown = relative.display().to_string();
        let parts: Vec<String> = relative
            .with_extension("")
            .components()
            .map(|part| part.as_os_str().to_string_lossy().into_owned())
            .collect();
        if parts[0] == "lib" {
            continue;
        }
        let resolve = |name: &str| {
            if modules.contains(name) {
                Some(name.to_owned())
            } else {
                owner.get(name).cloned()
            }
        };
        let mut named = named_after(code, "crate");
        if parts.len() == 1 {
            named.extend(named_after(code, "super"));
        }
        for module in named.iter().filter_map(|name| resolve(name)) {
            if module != parts[0] {
                crate_edges
                    .entry(parts[0].clone())
                    .or_default()
                    .push((module, shown.clone()));
            }
        }
        if parts.len() == 2 {
            let folder = path.parent().unwrap();
            for name in named_after(code, "super") {
                if folder.join(format!("{name}.rs")).is_file() && name != parts[1] {
                    folder_edges
                        .entry(format!("{}/{}", parts[0], parts[1]))
                        .or_default()
                        .push((format!("{}/{name}", parts[0]), shown.clone()));
                }
            }
        }
    }
    assert!(
        crate_edges.contains_key("session") && folder_edges.contains_key("session/forks"),
        "the check reads no imports: {crate_edges:?}"
    );
    for edges in [&crate_edges, &folder_edges] {
        if let Some(cycle) = a_cycle(edges) {
            panic!(
                "an import loop in crates/box-host/src: {cycle}; move what both sides need into the lower one (or a module of its own)"
            );
        }
    }
}
