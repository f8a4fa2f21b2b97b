//! The package registries of `tests/fixtures/registries.py` (a PyPI simple
//! index, a cargo sparse registry, a Go module proxy, an npm registry and git's
//! smart HTTP), started on the host's loopback for one test, over HTTPS with a
//! CA made at start, each request a line of an access log the test reads.
//!
//! A unit reaches them through its egress proxy by their names, pinned to
//! 127.0.0.1 with `[network] hosts` ([`Registries::network_toml`]), and trusts
//! them through the CA variables ([`trust_env`]) pointing at a copy of
//! [`Registries::ca`] the unit can read (in its workspace: a profile's `[env]
//! set` hands the path over, [`Registries::env_set_toml`]). On the host, or in
//! a container on the host's network, `localhost` works too: the certificate
//! names it, and the URLs a registry hands out (npm tarballs, cargo downloads)
//! follow the request's `Host`.
//!
//! The packages, the same two in every ecosystem (`boxdemo-greet` needs
//! `boxdemo-util`; every greeting is `HELLO <NAME>!`): PyPI `boxdemo-greet`
//! and `boxdemo-util` 1.0.0 (modules `boxdemo_greet.greet`,
//! `boxdemo_util.shout`); crates `boxdemo-greet` and `boxdemo-util` 1.0.0
//! (`boxdemo_greet::greet`); Go `example.com/boxdemo/greet` and
//! `example.com/boxdemo/util` v1.0.0 (`greet.Hello`); npm `boxdemo-greet` and
//! `boxdemo-util` 1.0.0 (`require("boxdemo-greet").greet`); git `boxdemo.git`
//! (one commit on `main`: `README.md`, `greet.sh`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::repo_root;

/// How long the fixture may take to make its CA, content and listeners on a
/// loaded machine.
const READY_WITHIN: Duration = Duration::from_secs(60);

/// The name cargo knows the fixture's registry by in [`Registries::client_env`]
/// (`CARGO_REGISTRIES_BOXTEST_INDEX`): a dependency names it with
/// `registry = "boxtest"`. [`Registries::cargo_config`] makes it replace
/// crates.io instead.
pub const CARGO_REGISTRY: &str = "boxtest";

/// One of the five registries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Registry {
    /// The PyPI simple index (PEP 503 and 691).
    Pypi,
    /// The cargo sparse registry.
    Crates,
    /// The Go module proxy.
    Goproxy,
    /// The npm registry.
    Npm,
    /// git's smart HTTP.
    Git,
}

impl Registry {
    /// Every registry.
    pub const ALL: [Registry; 5] = [
        Registry::Pypi,
        Registry::Crates,
        Registry::Goproxy,
        Registry::Npm,
        Registry::Git,
    ];

    /// Its name in `ready.json` and in the access log's `registry` field.
    pub fn key(self) -> &'static str {
        match self {
            Registry::Pypi => "pypi",
            Registry::Crates => "crates",
            Registry::Goproxy => "goproxy",
            Registry::Npm => "npm",
            Registry::Git => "git",
        }
    }
}

/// Where a registry listens: its host name (pinned to 127.0.0.1 by the
/// test) and its port on the host's loopback.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The name the certificate gives it (`pypi.example.com`, ...).
    pub host: String,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

impl Endpoint {
    /// `host:port`, as `[network] allow` and a URL write it.
    pub fn authority(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// `https://host:port`.
    pub fn url(&self) -> String {
        format!("https://{}", self.authority())
    }

    /// `https://localhost:port`, for a client on the host that cannot pin names.
    pub fn local_url(&self) -> String {
        format!("https://localhost:{}", self.port)
    }
}

/// One line of the access log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Which registry answered.
    pub registry: String,
    /// `GET`, `POST`, `HEAD`.
    pub method: String,
    /// The path with its query.
    pub path: String,
    /// The status answered.
    pub status: u16,
    /// The body's length.
    pub bytes: u64,
    /// The client's `User-Agent`.
    pub user_agent: String,
}

impl Request {
    /// Whether this request fetched a package's content (a wheel, a `.crate`,
    /// a module zip, an npm tarball, a git pack), rather than an index or
    /// metadata: what a warm cache makes unnecessary.
    pub fn is_download(&self) -> bool {
        let path = self.path.split('?').next().unwrap_or(&self.path);
        self.status == 200
            && match self.registry.as_str() {
                "pypi" => path.starts_with("/packages/"),
                "crates" => path.ends_with("/download"),
                "goproxy" => path.ends_with(".zip"),
                "npm" => path.ends_with(".tgz"),
                "git" => path.ends_with("/git-upload-pack") && self.method == "POST",
                _ => false,
            }
    }
}

/// The five registries, serving until dropped.
pub struct Registries {
    child: Child,
    dir: tempfile::TempDir,
    ca: PathBuf,
    log: PathBuf,
    endpoints: BTreeMap<Registry, Endpoint>,
}

impl Registries {
    /// Start them on free ports of 127.0.0.1 with the default names
    /// (`pypi.example.com`, `crates.example.com`, `goproxy.example.com`,
    /// `npm.example.com`, `git.example.com`); panics naming what failed (the
    /// fixture needs `python3`, `openssl` and `git` on `PATH`).
    pub fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let script = repo_root().join("tests/fixtures/registries.py");
        let mut child = Command::new("python3")
            .arg(&script)
            .arg("--dir")
            .arg(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|error| panic!("python3 {}: {error}", script.display()));
        let ready = dir.path().join("ready.json");
        let started = Instant::now();
        let text = loop {
            if let Ok(text) = std::fs::read_to_string(&ready) {
                break text;
            }
            if let Some(status) = child.try_wait().unwrap() {
                let mut stderr = String::new();
                if let Some(mut pipe) = child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
                }
                panic!("the registries fixture exited ({status}) before it was ready: {stderr}");
            }
            if started.elapsed() > READY_WITHIN {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the registries fixture was not ready within {READY_WITHIN:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let ready: Value = serde_json::from_str(&text).unwrap();
        let endpoints = Registry::ALL
            .into_iter()
            .map(|registry| {
                let entry = &ready["registries"][registry.key()];
                let endpoint = Endpoint {
                    host: entry["host"].as_str().unwrap().to_owned(),
                    port: u16::try_from(entry["port"].as_u64().unwrap()).unwrap(),
                };
                (registry, endpoint)
            })
            .collect();
        Self {
            child,
            ca: PathBuf::from(ready["ca"].as_str().unwrap()),
            log: PathBuf::from(ready["log"].as_str().unwrap()),
            dir,
            endpoints,
        }
    }

    /// Where `registry` listens.
    pub fn endpoint(&self, registry: Registry) -> &Endpoint {
        &self.endpoints[&registry]
    }

    /// The CA's certificate (PEM) on the host: what a client must trust.
    pub fn ca(&self) -> &Path {
        &self.ca
    }

    /// The fixture's directory (the CA, the content, the log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The `[network] allow` entries: each registry's `host:port`, nothing else.
    pub fn allow(&self) -> Vec<String> {
        self.endpoints.values().map(Endpoint::authority).collect()
    }

    /// A profile's `[network]` table body reaching the five registries and
    /// nothing else: `mode = "egress"`, `allow` and `hosts` (every name pinned
    /// to 127.0.0.1). The profile needs `[operator] allow_dangerous =
    /// ["private-destinations"]` too, since loopback is one.
    pub fn network_toml(&self) -> String {
        let allow: Vec<String> = self
            .allow()
            .iter()
            .map(|entry| format!("{entry:?}"))
            .collect();
        let hosts: Vec<String> = self
            .endpoints
            .values()
            .map(|endpoint| format!("{:?} = \"127.0.0.1\"", endpoint.host))
            .collect();
        format!(
            "mode = \"egress\"\nallow = [{}]\nhosts = {{ {} }}\n",
            allow.join(", "),
            hosts.join(", ")
        )
    }

    /// The variables that point each client at its registry by name (for a
    /// unit): pip's index, npm's registry, cargo's `boxtest` registry, Go's
    /// proxy (with the checksum database off: it would ask sum.golang.org
    /// about modules it cannot know), and the self-checks that would ask a
    /// registry about pip and npm themselves turned off.
    pub fn client_env(&self) -> Vec<(String, String)> {
        self.env_with(Endpoint::url)
    }

    /// [`client_env`](Self::client_env) with `localhost` URLs, for clients on
    /// the host (or in a container on its network) that cannot pin names.
    pub fn local_client_env(&self) -> Vec<(String, String)> {
        self.env_with(Endpoint::local_url)
    }

    fn env_with(&self, url: impl Fn(&Endpoint) -> String) -> Vec<(String, String)> {
        let at = |registry| url(self.endpoint(registry));
        [
            ("PIP_INDEX_URL", format!("{}/simple/", at(Registry::Pypi))),
            ("PIP_DISABLE_PIP_VERSION_CHECK", "1".to_owned()),
            ("npm_config_registry", format!("{}/", at(Registry::Npm))),
            ("npm_config_update_notifier", "false".to_owned()),
            ("npm_config_fund", "false".to_owned()),
            (
                "CARGO_REGISTRIES_BOXTEST_INDEX",
                format!("sparse+{}/index/", at(Registry::Crates)),
            ),
            ("GOPROXY", at(Registry::Goproxy)),
            ("GOSUMDB", "off".to_owned()),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect()
    }

    /// A cargo `config.toml` that makes the fixture replace crates.io, so a
    /// plain `boxdemo-greet = "1"` resolves there (reached by name, or by
    /// `localhost` with `local`).
    pub fn cargo_config(&self, local: bool) -> String {
        let crates = self.endpoint(Registry::Crates);
        let url = if local {
            crates.local_url()
        } else {
            crates.url()
        };
        format!(
            "[source.crates-io]\nreplace-with = \"{CARGO_REGISTRY}\"\n\n[source.{CARGO_REGISTRY}]\nregistry = \"sparse+{url}/index/\"\n"
        )
    }

    /// The body of a profile's `[env]` table (`set = { ... }`): the clients'
    /// variables and the CA variables pointing at `ca_in_unit`, where the test
    /// put a copy of [`ca`](Self::ca) the unit can read, then `extra`.
    pub fn env_set_toml(&self, ca_in_unit: &str, extra: &[(&str, &str)]) -> String {
        let set: Vec<String> = self
            .client_env()
            .into_iter()
            .chain(trust_env(ca_in_unit))
            .chain(
                extra
                    .iter()
                    .map(|(name, value)| ((*name).to_owned(), (*value).to_owned())),
            )
            .map(|(name, value)| format!("{name} = {value:?}"))
            .collect();
        format!("set = {{ {} }}\n", set.join(", "))
    }

    /// `https://git.example.com:PORT/REPO` (`boxdemo.git`).
    pub fn git_url(&self, repo: &str) -> String {
        format!("{}/{repo}", self.endpoint(Registry::Git).url())
    }

    /// Every request answered so far, in order.
    pub fn requests(&self) -> Vec<Request> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines()
            .filter(|line| !line.trim().is_empty())
            .map(|line| {
                let entry: Value = serde_json::from_str(line)
                    .unwrap_or_else(|error| panic!("access log line {line:?}: {error}"));
                let text = |key: &str| entry[key].as_str().unwrap_or_default().to_owned();
                Request {
                    registry: text("registry"),
                    method: text("method"),
                    path: text("path"),
                    status: u16::try_from(entry["status"].as_u64().unwrap_or(0)).unwrap_or(0),
                    bytes: entry["bytes"].as_u64().unwrap_or(0),
                    user_agent: text("userAgent"),
                }
            })
            .collect()
    }

    /// The requests `registry` answered.
    pub fn requests_to(&self, registry: Registry) -> Vec<Request> {
        self.requests()
            .into_iter()
            .filter(|request| request.registry == registry.key())
            .collect()
    }

    /// The package downloads so far ([`Request::is_download`]).
    pub fn downloads(&self) -> Vec<Request> {
        self.requests()
            .into_iter()
            .filter(Request::is_download)
            .collect()
    }
}

impl Drop for Registries {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The variables that make each client trust the CA at `ca` (a path as the
/// client sees it): `SSL_CERT_FILE` (Go, OpenSSL's default paths, Python's
/// `ssl`), `PIP_CERT` and `REQUESTS_CA_BUNDLE` (pip, requests), `CURL_CA_BUNDLE`
/// (curl), `NODE_EXTRA_CA_CERTS` (node) and `npm_config_cafile` (npm),
/// `CARGO_HTTP_CAINFO` (cargo), `GIT_SSL_CAINFO` (git). Each but
/// `NODE_EXTRA_CA_CERTS` replaces the client's own roots: a unit with these
/// trusts this CA only.
pub fn trust_env(ca: &str) -> Vec<(String, String)> {
    [
        "SSL_CERT_FILE",
        "PIP_CERT",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS",
        "npm_config_cafile",
        "CARGO_HTTP_CAINFO",
        "GIT_SSL_CAINFO",
    ]
    .into_iter()
    .map(|name| (name.to_owned(), ca.to_owned()))
    .collect()
}
