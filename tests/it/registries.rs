//! The package registry fixtures (`tests/fixtures/registries.py`, started by
//! `support::registries`) against the real clients of the toolchain image
//! `box-dev:bookworm` (pip, cargo, go, npm, git), and the same clients reaching
//! them from a unit through its egress proxy, with only the registries' names
//! allowed (issue 23, items 6 and 7's footing).

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output};

use crate::support::registries::{CARGO_REGISTRY, Registries, Registry, trust_env};
use crate::support::{box_bin, under_ci};

/// The toolchain image (`box image build dev`, `scripts/images.sh`).
const DEV_IMAGE: &str = "box-dev:bookworm";

/// The uid and gid the dev image's user has, which the clients run as.
const DEV_USER: &str = "1000:1000";

/// Whether the dev image is on an engine that answers; says loudly why not
/// when it is not, and fails under CI, where scripts/test.sh built it.
pub(crate) fn dev_image_present() -> bool {
    let present = Command::new("docker")
        .args(["image", "inspect", "--format", "{{.Id}}", DEV_IMAGE])
        .output();
    match present {
        Ok(output) if output.status.success() => true,
        Ok(output) => {
            let why = format!(
                "{DEV_IMAGE} is missing: build it with scripts/images.sh (or `box image build dev`): {}",
                String::from_utf8_lossy(&output.stderr).trim()
            );
            assert!(!under_ci(), "{why}");
            eprintln!("\n*** REGISTRY TESTS NOT RUN: {why} ***\n");
            false
        }
        Err(error) => {
            assert!(!under_ci(), "CI needs docker to run {DEV_IMAGE}: {error}");
            eprintln!("\n*** REGISTRY TESTS NOT RUN: no docker command: {error} ***\n");
            false
        }
    }
}

/// What the clients do in the dev image: install or fetch `boxdemo-greet`
/// from each registry and greet with it, clone and push over git, each line
/// of its outcome marked with the client's name. `$GIT_URL` is the repository.
const CLIENTS: &str = r#"set -u
export HOME=/tmp/h
mkdir -p "$HOME" /tmp/work && cd /tmp/work
python3 -m venv venv && venv/bin/pip install -q boxdemo-greet \
  && echo "pip: $(venv/bin/python -c 'import boxdemo_greet; print(boxdemo_greet.greet("box"))')"
mkdir -p named/src && cd named
printf '[package]\nname = "named"\nversion = "0.1.0"\nedition = "2021"\n\n[dependencies]\nboxdemo-greet = { version = "1", registry = "boxtest" }\n' > Cargo.toml
echo 'fn main() { println!("{}", boxdemo_greet::greet("box")); }' > src/main.rs
echo "cargo registry: $(cargo run -q 2>&1)"
cd /tmp/work && mkdir -p replaced/src cargo-home && cd replaced
printf '[package]\nname = "replaced"\nversion = "0.1.0"\nedition = "2021"\n\n[dependencies]\nboxdemo-greet = "1"\n' > Cargo.toml
echo 'fn main() { println!("{}", boxdemo_greet::greet("box")); }' > src/main.rs
cp /registries/cargo-config.toml /tmp/work/cargo-home/config.toml
echo "cargo crates-io: $(CARGO_HOME=/tmp/work/cargo-home cargo run -q 2>&1)"
cd /tmp/work && mkdir -p gomod && cd gomod
printf 'module example.org/app\n\ngo 1.19\n\nrequire example.com/boxdemo/greet v1.0.0\n' > go.mod
printf 'package main\n\nimport (\n\t"fmt"\n\n\t"example.com/boxdemo/greet"\n)\n\nfunc main() { fmt.Println(greet.Hello("box")) }\n' > main.go
go mod tidy 2>go.err || cat go.err
echo "go: $(go run . 2>&1)"
cd /tmp/work && mkdir -p js && cd js && echo '{"name": "app", "version": "1.0.0", "private": true}' > package.json
npm install -q boxdemo-greet >/dev/null 2>npm.err || cat npm.err
echo "npm: $(node -e 'console.log(require("boxdemo-greet").greet("box"))' 2>&1)"
cd /tmp/work && git clone -q "$GIT_URL" boxdemo 2>&1 && echo "git: $(sh boxdemo/greet.sh box)"
cd boxdemo && echo pushed > pushed.txt && git add pushed.txt \
  && git -c user.name=box -c user.email=box@example.com commit -q -m push \
  && git push -q origin main 2>&1 && echo "git push: done"
"#;

/// `docker run` of the dev image on the host's network, with each registry's
/// name pinned to 127.0.0.1, the CA at /registries/ca.pem, `env` and `script`.
fn run_in_dev_image(registries: &Registries, env: &[(String, String)], script: &str) -> Output {
    let mut command = Command::new("docker");
    command.args(["run", "--rm", "--network", "host", "--user", DEV_USER]);
    command.args(["--label", "box.test=registries"]);
    for registry in Registry::ALL {
        command
            .arg("--add-host")
            .arg(format!("{}:127.0.0.1", registries.endpoint(registry).host));
    }
    command.arg("--volume").arg(format!(
        "{}:/registries:ro",
        registries.dir().join("mounted").display()
    ));
    for (name, value) in env {
        command.arg("--env").arg(format!("{name}={value}"));
    }
    command.args([DEV_IMAGE, "bash", "-c", script]);
    command.output().unwrap()
}

/// Every registry's protocol, served to its own client in the dev image by
/// the names a unit will use (pinned to 127.0.0.1) over TLS with the test CA:
/// pip resolves `boxdemo-greet` and its dependency from the simple index,
/// cargo from the sparse registry both as a named registry and as crates.io's
/// replacement, go from the module proxy, npm from the registry, git clones
/// and pushes over smart HTTP; the access log holds each download, and
/// `Request::is_download` tells those from index and metadata requests.
#[test]
fn the_registry_fixtures_serve_pip_cargo_go_npm_and_git() {
    if !dev_image_present() {
        return;
    }
    let registries = Registries::start();
    let mounted = registries.dir().join("mounted");
    std::fs::create_dir(&mounted).unwrap();
    std::fs::copy(registries.ca(), mounted.join("ca.pem")).unwrap();
    std::fs::write(
        mounted.join("cargo-config.toml"),
        registries.cargo_config(false),
    )
    .unwrap();
    let mut env = registries.client_env();
    env.extend(trust_env("/registries/ca.pem"));
    env.push(("GIT_URL".to_owned(), registries.git_url("boxdemo.git")));
    let output = run_in_dev_image(&registries, &env, CLIENTS);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let said = format!(
        "{stdout}\nstderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    for line in [
        "pip: HELLO BOX!",
        "cargo registry: HELLO BOX!",
        "cargo crates-io: HELLO BOX!",
        "go: HELLO BOX!",
        "npm: HELLO BOX!",
        "git: HELLO BOX!",
        "git push: done",
    ] {
        assert!(
            stdout.lines().any(|seen| seen == line),
            "{line:?} missing: {said}"
        );
    }

    let mut downloads: Vec<(String, String)> = registries
        .downloads()
        .into_iter()
        .map(|request| (request.registry, request.path))
        .collect();
    downloads.sort();
    downloads.dedup();
    let expected: Vec<(String, String)> = [
        ("crates", "/api/v1/crates/boxdemo-greet/1.0.0/download"),
        ("crates", "/api/v1/crates/boxdemo-util/1.0.0/download"),
        ("git", "/boxdemo.git/git-upload-pack"),
        ("goproxy", "/example.com/boxdemo/greet/@v/v1.0.0.zip"),
        ("goproxy", "/example.com/boxdemo/util/@v/v1.0.0.zip"),
        ("npm", "/boxdemo-greet/-/boxdemo-greet-1.0.0.tgz"),
        ("npm", "/boxdemo-util/-/boxdemo-util-1.0.0.tgz"),
        ("pypi", "/packages/boxdemo_greet-1.0.0-py3-none-any.whl"),
        ("pypi", "/packages/boxdemo_util-1.0.0-py3-none-any.whl"),
    ]
    .into_iter()
    .map(|(registry, path)| (registry.to_owned(), path.to_owned()))
    .collect();
    assert_eq!(downloads, expected, "{said}");
    // Both cargo configurations (a named registry, crates.io replaced), each
    // with a cache of its own, downloaded both crates.
    let crates = registries
        .downloads()
        .into_iter()
        .filter(|request| request.registry == "crates")
        .count();
    assert_eq!(crates, 4, "{said}");
    // Index and metadata requests are not downloads.
    let requests = registries.requests();
    for (registry, path) in [
        ("pypi", "/simple/boxdemo-greet/"),
        ("crates", "/index/config.json"),
        ("crates", "/index/bo/xd/boxdemo-greet"),
        ("goproxy", "/example.com/boxdemo/greet/@v/v1.0.0.mod"),
        ("npm", "/boxdemo-greet"),
        ("git", "/boxdemo.git/info/refs?service=git-upload-pack"),
    ] {
        let request = requests
            .iter()
            .find(|request| request.registry == registry && request.path == path)
            .unwrap_or_else(|| panic!("no request to {registry} {path}: {requests:?}"));
        assert_eq!(request.status, 200, "{request:?}");
        assert!(!request.is_download(), "{request:?}");
    }
    // Each client said who it is; both cargo styles reached the same registry.
    let agent = |registry: Registry, prefix: &str| {
        registries
            .requests_to(registry)
            .iter()
            .any(|request| request.user_agent.starts_with(prefix))
    };
    assert!(agent(Registry::Pypi, "pip/"), "{requests:?}");
    assert!(agent(Registry::Crates, "cargo/"), "{requests:?}");
    assert!(agent(Registry::Goproxy, "Go-http-client/"), "{requests:?}");
    assert!(agent(Registry::Npm, "npm/"), "{requests:?}");
    assert!(agent(Registry::Git, "git/"), "{requests:?}");
    assert!(
        requests
            .iter()
            .any(|request| request.path == "/boxdemo.git/git-receive-pack" && request.status == 200),
        "the push: {requests:?}"
    );
}

/// A client that does not trust the test CA is refused by TLS, and nothing is
/// served to it: the fixtures are not reachable around the CA handling the
/// real-job tests rely on.
#[test]
fn a_client_without_the_test_ca_is_refused() {
    if !dev_image_present() {
        return;
    }
    let registries = Registries::start();
    std::fs::create_dir(registries.dir().join("mounted")).unwrap();
    let env = registries.client_env();
    let output = run_in_dev_image(
        &registries,
        &env,
        "export HOME=/tmp/h; mkdir -p $HOME; python3 -m venv /tmp/v && /tmp/v/bin/pip install -q --retries 0 --timeout 10 boxdemo-greet; echo pip=$?; curl -sS \"$PIP_INDEX_URL\" >/dev/null; echo curl=$?",
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stdout.contains("pip=1"), "{stdout}\n{stderr}");
    assert!(stdout.contains("curl=60"), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("CERTIFICATE_VERIFY_FAILED") || stderr.contains("certificate"),
        "{stderr}"
    );
    assert_eq!(registries.requests(), Vec::new());
}

/// Issue 23, item 6: pip, cargo (sparse index), Go modules, npm and git over
/// HTTPS work from a unit whose `[network] allow` names only their
/// registries, through the unit's egress proxy, with nothing but the proxy
/// variables box sets (`HTTPS_PROXY` and friends, `NO_PROXY` for loopback)
/// and the profile's `[env] set` (each registry's URL, and the CA variables
/// pointing at the test CA in the workspace). The unit has no other way out,
/// so every request in the access log crossed the proxy.
#[test]
fn package_managers_reach_their_registries_through_egress() {
    if !dev_image_present() {
        return;
    }
    let registries = Registries::start();
    let workspace = tempfile::tempdir().unwrap();
    let root = workspace.path();
    std::fs::copy(registries.ca(), root.join("registries-ca.pem")).unwrap();
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o777)).unwrap();
    let profiles = tempfile::tempdir().unwrap();
    std::fs::write(
        profiles.path().join("registries.toml"),
        format!(
            r#"description = "the test registries through egress"
extends = "default"

[workspace]
image = "{DEV_IMAGE}"
user = "{DEV_USER}"

[network]
{network}
[env]
{set}
[limits]
call_timeout = "15m"
start_timeout = "5m"

[operator]
allow_dangerous = ["private-destinations"]
"#,
            network = registries.network_toml(),
            // A home the tools can write (the unit's own is read-only
            // until issue 23's writable home).
            set = registries.env_set_toml(
                "/workspace/registries-ca.pem",
                &[("HOME", "/workspace/home")]
            ),
        ),
    )
    .unwrap();
    let git_url = registries.git_url("boxdemo.git");
    // The workspace, not /tmp, holds what runs: /tmp is mounted noexec.
    let script = format!(
        r#"set -u
cd /workspace && mkdir -p home
env | grep -E '^(HTTPS_PROXY|https_proxy|NO_PROXY)=' | sort
python3 -m venv venv && venv/bin/pip install -q boxdemo-greet \
  && echo "pip: $(venv/bin/python -c 'import boxdemo_greet; print(boxdemo_greet.greet("box"))')"
mkdir -p rs/src && cd rs
printf '[package]\nname = "app"\nversion = "0.1.0"\nedition = "2021"\n\n[dependencies]\nboxdemo-greet = {{ version = "1", registry = "{CARGO_REGISTRY}" }}\n' > Cargo.toml
echo 'fn main() {{ println!("{{}}", boxdemo_greet::greet("box")); }}' > src/main.rs
echo "cargo: $(cargo run -q 2>&1)"
cd /workspace && mkdir -p gomod && cd gomod
printf 'module example.org/app\n\ngo 1.19\n\nrequire example.com/boxdemo/greet v1.0.0\n' > go.mod
printf 'package main\n\nimport (\n\t"fmt"\n\n\t"example.com/boxdemo/greet"\n)\n\nfunc main() {{ fmt.Println(greet.Hello("box")) }}\n' > main.go
go mod tidy 2>go.err || cat go.err
echo "go: $(go build -o app . 2>&1 && ./app)"
cd /workspace && mkdir -p js && cd js && echo '{{"name": "app", "version": "1.0.0", "private": true}}' > package.json
npm install -q boxdemo-greet >/dev/null 2>npm.err || cat npm.err
echo "npm: $(node -e 'console.log(require("boxdemo-greet").greet("box"))' 2>&1)"
cd /workspace && git clone -q {git_url} boxdemo 2>&1 && echo "git: $(sh boxdemo/greet.sh box)"
"#
    );
    let output = Command::new(box_bin())
        .args(["run", "--backend", "docker", "--profiles"])
        .arg(profiles.path())
        .args(["--profile", "registries", "--workspace"])
        .arg(root)
        .args(["--", "bash", "-c", &script])
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let said = format!(
        "{stdout}\nstderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(output.status.code(), Some(0), "{said}");
    for line in [
        "HTTPS_PROXY=http://127.0.0.1:3128",
        "https_proxy=http://127.0.0.1:3128",
        "NO_PROXY=localhost,127.0.0.1,::1",
        "pip: HELLO BOX!",
        "cargo: HELLO BOX!",
        "go: HELLO BOX!",
        "npm: HELLO BOX!",
        "git: HELLO BOX!",
    ] {
        assert!(
            stdout.lines().any(|seen| seen == line),
            "{line:?} missing: {said}"
        );
    }
    let downloads = registries.downloads();
    for registry in Registry::ALL {
        assert!(
            downloads
                .iter()
                .any(|request| request.registry == registry.key()),
            "nothing downloaded from {}: {:?}\n{said}",
            registry.key(),
            registries.requests()
        );
    }
}

/// The machine's own pip configuration, read at run time (its index URL, else
/// pip's built-in default; the CA bundle it trusts), never written here.
fn machine_pip() -> Option<(String, Option<String>)> {
    let pip_says = |key: &str| {
        let output = Command::new("python3")
            .args(["-m", "pip", "config", "get", key])
            .output()
            .ok()?;
        let value = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        (output.status.success() && !value.is_empty()).then_some(value)
    };
    let index = pip_says("global.index-url")
        .or_else(|| std::env::var("PIP_INDEX_URL").ok())
        .or_else(|| {
            let output = Command::new("python3")
                .args([
                    "-c",
                    "from pip._internal.models.index import PyPI; print(PyPI.simple_url)",
                ])
                .output()
                .ok()?;
            output
                .status
                .success()
                .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
        })?;
    let cert = pip_says("global.cert").or_else(|| std::env::var("PIP_CERT").ok());
    Some((index.trim_end_matches('/').to_owned(), cert))
}

/// The machine's own cargo registry, read at run time from the index cargo
/// keeps (`$CARGO_HOME/registry/index/HOST-HASH/config.json`): the index's
/// host and its download host.
fn machine_cargo() -> Option<(String, String)> {
    let home = std::env::var_os("CARGO_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|home| std::path::Path::new(&home).join(".cargo"))
        })?;
    for entry in std::fs::read_dir(home.join("registry").join("index")).ok()? {
        let dir = entry.ok()?.path();
        let name = dir.file_name()?.to_str()?.to_owned();
        let Ok(config) = std::fs::read_to_string(dir.join("config.json")) else {
            continue;
        };
        let config: serde_json::Value = serde_json::from_str(&config).ok()?;
        let index = name.rsplit_once('-')?.0.to_owned();
        let download = host_of(config["dl"].as_str()?)?;
        return Some((index, download));
    }
    None
}

/// The host name of an `https://` URL.
fn host_of(url: &str) -> Option<String> {
    let rest = url.strip_prefix("https://")?;
    let authority = rest.split('/').next()?;
    Some(authority.rsplit('@').next()?.split(':').next()?.to_owned())
}

/// Issue 23, item 7: where this machine reaches its public package index, a
/// unit installs a small package from it through its egress proxy with only
/// the index's and its file host's names allowed. The names come from the
/// machine's own pip configuration at run time; the addresses they resolve
/// to may be reserved ranges (a proxy, a test network), which the profile's
/// `private-destinations` consent lets through.
#[test]
fn a_unit_installs_from_the_machines_own_package_index_through_egress() {
    if !dev_image_present() {
        return;
    }
    let Some((index, cert)) = machine_pip() else {
        eprintln!("\n*** PUBLIC INDEX TEST NOT RUN: this machine has no pip ***\n");
        return;
    };
    // The index page of the package, fetched from the host as pip would,
    // names the file host the unit must reach too.
    let page = Command::new("python3")
        .args([
            "-c",
            "import sys, ssl, urllib.request as u\n\
             ctx = ssl.create_default_context(cafile=sys.argv[2] or None)\n\
             opener = u.build_opener(u.ProxyHandler({}), u.HTTPSHandler(context=ctx))\n\
             print(opener.open(sys.argv[1], timeout=20).read().decode())",
        ])
        .arg(format!("{index}/six/"))
        .arg(cert.clone().unwrap_or_default())
        .output()
        .unwrap();
    if !page.status.success() {
        eprintln!(
            "\n*** PUBLIC INDEX TEST NOT RUN: this machine does not reach {index} directly: {} ***\n",
            String::from_utf8_lossy(&page.stderr).trim()
        );
        return;
    }
    let page = String::from_utf8_lossy(&page.stdout);
    let files = page
        .split("href=\"")
        .nth(1)
        .and_then(host_of)
        .expect("the index page links to its files");
    let index_host = host_of(&index).expect("an https index");
    let workspace = tempfile::tempdir().unwrap();
    std::fs::set_permissions(workspace.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let cert_arg = match &cert {
        Some(cert) => {
            std::fs::copy(cert, workspace.path().join("pip-ca.pem")).unwrap();
            " --cert /workspace/pip-ca.pem"
        }
        None => "",
    };
    // Cargo's registry too, where this machine's cargo has used one.
    let cargo = machine_cargo();
    let mut allow = vec![index_host, files];
    let cargo_script = match &cargo {
        Some((index, download)) => {
            allow.extend([index.clone(), download.clone()]);
            let ca = if cert.is_some() {
                "CARGO_HTTP_CAINFO=/workspace/pip-ca.pem "
            } else {
                ""
            };
            format!(
                " && mkdir -p /tmp/c/src && cd /tmp/c \
                 && printf '[package]\nname = \"c\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\nitoa = \"1\"\n' > Cargo.toml \
                 && echo 'fn main() {{ println!(\"built with itoa {{}}\", itoa::Buffer::new().format(42)); }}' > src/main.rs \
                 && {ca}cargo run -q"
            )
        }
        None => {
            eprintln!(
                "\n*** this machine's cargo has used no registry: the cargo part is left out ***\n"
            );
            String::new()
        }
    };
    allow.sort();
    allow.dedup();
    let allow = allow
        .iter()
        .map(|host| format!("{host:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    let profiles = tempfile::tempdir().unwrap();
    std::fs::write(
        profiles.path().join("index.toml"),
        format!(
            r#"description = "the machine's own package index through egress"
extends = "dev"

[network]
mode = "egress"
allow = [{allow}]

[limits]
call_timeout = "10m"
start_timeout = "5m"

[operator]
allow_dangerous = ["private-destinations"]
"#
        ),
    )
    .unwrap();
    let script = format!(
        "python3 -m venv /tmp/v && /tmp/v/bin/pip install -q --no-cache-dir --index-url {index}/{cert_arg} six \
         && /tmp/v/bin/python -c 'import six; print(\"installed six\", six.__version__)'{cargo_script}"
    );
    let output = Command::new(box_bin())
        .args(["run", "--backend", "docker", "--profiles"])
        .arg(profiles.path())
        .args(["--profile", "index", "--workspace"])
        .arg(workspace.path())
        // No cache volumes: nothing of this test outlives it.
        .args(["--tighten", r#"{"volumes": []}"#])
        .args(["--", "bash", "-c", &script])
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let said = format!(
        "{}\nstderr: {}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(output.status.code(), Some(0), "{said}");
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("installed six "),
        "{said}"
    );
    if cargo.is_some() {
        assert!(
            String::from_utf8_lossy(&output.stdout).contains("built with itoa 42"),
            "{said}"
        );
    }
}
