//! What the init is started with: its command line (the unit key comes from
//! the environment, [`crate::protocol::KEY_ENV`], read by [`crate::run`]).
//!
//! ```text
//! box init --socket PATH --unit ID --lease-ms N [--home DIR] [--link REL=TARGET]...
//!          [--bridge 127.0.0.1:PORT=UNIX_PATH]... [--env NAME=VALUE]...
//!          -- EXECUTOR [ARG]...
//! ```
//!
//! [`InitConfig::to_args`] writes the same grammar, so a backend builds the
//! command line from the struct and the init parses it back unchanged.

use std::ffi::{OsStr, OsString};
use std::net::SocketAddr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::Duration;

/// A TCP→Unix bridge: the init listens on `listen` inside the unit and
/// forwards each connection to the Unix socket at `target` (the host's egress
/// proxy, bind-mounted). No policy lives here: the host judges what arrives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bridge {
    /// A loopback address inside the unit.
    pub listen: SocketAddr,
    /// The Unix socket each connection is forwarded to.
    pub target: PathBuf,
}

/// The init's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitConfig {
    /// The host's socket, which the init connects to.
    pub socket: PathBuf,
    /// The unit's identity, covered by the proofs.
    pub unit: String,
    /// The first lease: the host must renew within it.
    pub lease: Duration,
    /// Bridges to start before the executor.
    pub bridges: Vec<Bridge>,
    /// The unit's home (an empty tmpfs): before the executor starts, the
    /// init unpacks into it what the image put there, which the host left as
    /// [`crate::protocol::HOME_SEED`] beside the socket (absent or empty:
    /// nothing to unpack).
    pub home: Option<PathBuf>,
    /// Links the init makes in the home once it is filled, `REL` (relative
    /// to the home) to `TARGET` (absolute): a volume mounted elsewhere
    /// appears where the tools look (`~/.cache/pip`), while the home's
    /// directories stay the unit's user's own.
    pub links: Vec<(PathBuf, PathBuf)>,
    /// Variables set for the executor on top of the init's own environment
    /// (minus the unit key, which no child ever sees).
    pub executor_env: Vec<(OsString, OsString)>,
    /// The executor's command line; the first element is the program.
    pub executor: Vec<OsString>,
}

/// A command line the init cannot run with.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A required option was not given.
    #[error("box init: missing {0}")]
    Missing(&'static str),
    /// An option has no value after it.
    #[error("box init: {0} needs a value")]
    NoValue(String),
    /// An option that `box init` does not have.
    #[error(
        "box init: unknown option {0:?} (options: --socket, --unit, --lease-ms, --home, --link, --bridge, --env, then -- and the executor's command)"
    )]
    Unknown(String),
    /// A value that does not parse.
    #[error("box init: {option} {value:?}: {why}")]
    Invalid {
        /// The option.
        option: &'static str,
        /// What was given.
        value: String,
        /// What would be accepted.
        why: &'static str,
    },
}

impl InitConfig {
    /// Parses the arguments after `box init`.
    pub fn parse_args<I>(args: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator,
        I::Item: Into<OsString>,
    {
        let mut args = args.into_iter().map(Into::into);
        let mut socket = None;
        let mut unit = None;
        let mut lease = None;
        let mut bridges = Vec::new();
        let mut home = None;
        let mut links = Vec::new();
        let mut executor_env = Vec::new();
        let mut executor = Vec::new();
        while let Some(arg) = args.next() {
            let mut value = |option: &str| {
                args.next()
                    .ok_or_else(|| ConfigError::NoValue(option.to_owned()))
            };
            match arg.to_str() {
                Some("--socket") => socket = Some(PathBuf::from(value("--socket")?)),
                Some("--unit") => {
                    let given = value("--unit")?;
                    let text = given
                        .to_str()
                        .filter(|text| !text.is_empty())
                        .ok_or_else(|| {
                            invalid("--unit", &given, "a non-empty UTF-8 unit identity")
                        })?;
                    unit = Some(text.to_owned());
                }
                Some("--lease-ms") => {
                    let given = value("--lease-ms")?;
                    let milliseconds = given
                        .to_str()
                        .and_then(|text| text.parse::<u64>().ok())
                        .filter(|&milliseconds| milliseconds > 0)
                        .ok_or_else(|| {
                            invalid("--lease-ms", &given, "a positive number of milliseconds")
                        })?;
                    lease = Some(Duration::from_millis(milliseconds));
                }
                Some("--bridge") => bridges.push(parse_bridge(&value("--bridge")?)?),
                Some("--home") => {
                    let given = PathBuf::from(value("--home")?);
                    if !given.is_absolute() {
                        return Err(invalid("--home", given.as_os_str(), "an absolute path"));
                    }
                    home = Some(given);
                }
                Some("--link") => {
                    let given = value("--link")?;
                    let bytes = given.as_bytes();
                    let why = "REL=TARGET: a relative path in the home, then an absolute one";
                    let split = bytes
                        .iter()
                        .position(|&byte| byte == b'=')
                        .ok_or_else(|| invalid("--link", &given, why))?;
                    let relative = PathBuf::from(OsStr::from_bytes(&bytes[..split]));
                    let target = PathBuf::from(OsStr::from_bytes(&bytes[split + 1..]));
                    let clean = relative.components().count() > 0
                        && relative
                            .components()
                            .all(|part| matches!(part, std::path::Component::Normal(_)));
                    if !clean || !target.is_absolute() {
                        return Err(invalid("--link", &given, why));
                    }
                    links.push((relative, target));
                }
                Some("--env") => {
                    let given = value("--env")?;
                    let bytes = given.as_bytes();
                    let split = bytes
                        .iter()
                        .position(|&byte| byte == b'=')
                        .filter(|&at| at > 0)
                        .ok_or_else(|| invalid("--env", &given, "NAME=VALUE"))?;
                    executor_env.push((
                        OsStr::from_bytes(&bytes[..split]).to_owned(),
                        OsStr::from_bytes(&bytes[split + 1..]).to_owned(),
                    ));
                }
                Some("--") => {
                    executor.extend(args.by_ref());
                    break;
                }
                _ => return Err(ConfigError::Unknown(arg.to_string_lossy().into_owned())),
            }
        }
        if executor.is_empty() {
            return Err(ConfigError::Missing("the executor's command (after --)"));
        }
        Ok(Self {
            socket: socket.ok_or(ConfigError::Missing("--socket"))?,
            unit: unit.ok_or(ConfigError::Missing("--unit"))?,
            lease: lease.ok_or(ConfigError::Missing("--lease-ms"))?,
            bridges,
            home,
            links,
            executor_env,
            executor,
        })
    }

    /// The arguments after `box init` that [`parse_args`](Self::parse_args)
    /// turns back into this configuration.
    pub fn to_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec![
            "--socket".into(),
            self.socket.clone().into(),
            "--unit".into(),
            self.unit.clone().into(),
            "--lease-ms".into(),
            self.lease.as_millis().to_string().into(),
        ];
        if let Some(home) = &self.home {
            args.extend(["--home".into(), home.clone().into()]);
        }
        for (relative, target) in &self.links {
            let mut spec = relative.clone().into_os_string();
            spec.push("=");
            spec.push(target);
            args.extend(["--link".into(), spec]);
        }
        for bridge in &self.bridges {
            let mut spec = OsString::from(format!("{}=", bridge.listen));
            spec.push(&bridge.target);
            args.extend(["--bridge".into(), spec]);
        }
        for (name, value) in &self.executor_env {
            let mut spec = name.clone();
            spec.push("=");
            spec.push(value);
            args.extend(["--env".into(), spec]);
        }
        args.push("--".into());
        args.extend(self.executor.iter().cloned());
        args
    }
}

fn parse_bridge(given: &OsStr) -> Result<Bridge, ConfigError> {
    let why = "LOOPBACK_ADDRESS:PORT=UNIX_SOCKET_PATH, e.g. 127.0.0.1:3128=/.box/run/egress.sock";
    let bytes = given.as_bytes();
    let split = bytes
        .iter()
        .position(|&byte| byte == b'=')
        .ok_or_else(|| invalid("--bridge", given, why))?;
    let listen: SocketAddr = std::str::from_utf8(&bytes[..split])
        .ok()
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| invalid("--bridge", given, why))?;
    if !listen.ip().is_loopback() {
        return Err(invalid(
            "--bridge",
            given,
            "the listening address must be loopback (127.0.0.0/8 or ::1)",
        ));
    }
    let target = PathBuf::from(OsStr::from_bytes(&bytes[split + 1..]));
    if !target.is_absolute() {
        return Err(invalid(
            "--bridge",
            given,
            "the Unix socket path must be absolute",
        ));
    }
    Ok(Bridge { listen, target })
}

fn invalid(option: &'static str, given: &OsStr, why: &'static str) -> ConfigError {
    ConfigError::Invalid {
        option,
        value: given.to_string_lossy().into_owned(),
        why,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<InitConfig, String> {
        InitConfig::parse_args(args.iter().copied()).map_err(|e| e.to_string())
    }

    #[test]
    fn a_full_command_line_parses_and_round_trips() {
        let config = parse(&[
            "--socket",
            "/.box/run/host.sock",
            "--unit",
            "s1/workspace",
            "--lease-ms",
            "30000",
            "--home",
            "/home/box",
            "--link",
            ".cache/pip=/.box/volumes/pip",
            "--bridge",
            "127.0.0.1:3128=/.box/run/egress.sock",
            "--env",
            "A=b=c",
            "--",
            "/box",
            "execute",
            "--root",
            "/workspace",
            "--",
            "--socket",
        ])
        .unwrap();
        assert_eq!(
            config,
            InitConfig {
                socket: "/.box/run/host.sock".into(),
                unit: "s1/workspace".into(),
                lease: Duration::from_secs(30),
                bridges: vec![Bridge {
                    listen: "127.0.0.1:3128".parse().unwrap(),
                    target: "/.box/run/egress.sock".into(),
                }],
                home: Some("/home/box".into()),
                links: vec![(".cache/pip".into(), "/.box/volumes/pip".into())],
                executor_env: vec![("A".into(), "b=c".into())],
                executor: ["/box", "execute", "--root", "/workspace", "--", "--socket"]
                    .map(OsString::from)
                    .to_vec(),
            }
        );
        assert_eq!(InitConfig::parse_args(config.to_args()), Ok(config));
    }

    #[test]
    fn bad_command_lines_say_what_would_be_accepted() {
        let base = ["--socket", "/s", "--unit", "u", "--lease-ms", "1000"];
        let with = |extra: &[&str]| {
            let mut args = base.to_vec();
            args.extend_from_slice(extra);
            parse(&args).err().unwrap_or_default()
        };
        assert_eq!(
            with(&[]),
            "box init: missing the executor's command (after --)"
        );
        assert_eq!(
            with(&["--"]),
            "box init: missing the executor's command (after --)"
        );
        assert_eq!(
            parse(&["--", "cat"]).err().unwrap_or_default(),
            "box init: missing --socket"
        );
        assert_eq!(
            with(&["--bridge", "0.0.0.0:80=/s", "--", "cat"]),
            "box init: --bridge \"0.0.0.0:80=/s\": the listening address must be loopback (127.0.0.0/8 or ::1)"
        );
        assert!(
            with(&["--bridge", "localhost:80=/s", "--", "cat"]).contains("LOOPBACK_ADDRESS:PORT")
        );
        assert!(with(&["--bridge", "[::1]:80=rel", "--", "cat"]).contains("must be absolute"));
        assert_eq!(
            with(&["--env", "=x", "--", "cat"]),
            "box init: --env \"=x\": NAME=VALUE"
        );
        assert!(
            with(&["--verbose", "--", "cat"]).starts_with("box init: unknown option \"--verbose\"")
        );
        assert_eq!(with(&["--unit"]), "box init: --unit needs a value");
        assert_eq!(
            parse(&[
                "--socket",
                "/s",
                "--unit",
                "u",
                "--lease-ms",
                "0",
                "--",
                "cat"
            ])
            .err()
            .unwrap_or_default(),
            "box init: --lease-ms \"0\": a positive number of milliseconds"
        );
    }
}
