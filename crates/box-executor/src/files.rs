//! The workspace files resource (`agentworkspace:///{op}{?path}`): read-only
//! stat, lstat, readdir, readlink and read of names beneath the root, answered
//! as one JSON document per read, with Go's `fs.FileMode` numbers and RFC 3339
//! times so a dax session decodes them as its own workspace's.

use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use cap_std::fs::{Metadata, MetadataExt, PermissionsExt};
use serde_json::{Value, json};

use super::names;
use super::workspace::{FileError, Workspace, is_escape};

/// The one resource template the executor serves.
pub(crate) const URI_TEMPLATE: &str = "agentworkspace:///{op}{?path}";
const SCHEME_PREFIX: &str = "agentworkspace:///";
/// The most bytes `read` returns (a larger file is refused).
const MAX_FILE_BYTES: u64 = 1024 * 1024;
/// The most entries `readdir` returns (a larger directory is refused).
const MAX_DIR_ENTRIES: usize = 10_000;
/// The longest error message sent.
const MAX_MESSAGE_BYTES: usize = 512;

/// The template as `resources/templates/list` shows it.
pub(crate) fn template() -> Value {
    json!({
        "uriTemplate": URI_TEMPLATE,
        "name": "workspace-files",
        "title": "The workspace's files, read-only",
        "description": "op is stat, lstat, readdir, readlink or read; path a name relative to the workspace's root. Reads are bounded; nothing is written.",
        "mimeType": "application/json",
    })
}

/// Why a files request failed, as the error document's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    NotExist,
    Outside,
    Invalid,
    Permission,
    Other,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::NotExist => "notexist",
            Kind::Outside => "outside",
            Kind::Invalid => "invalid",
            Kind::Permission => "permission",
            Kind::Other => "other",
        }
    }
}

struct Failure {
    kind: Kind,
    message: String,
}

fn failure(kind: Kind, message: impl Into<String>) -> Failure {
    Failure {
        kind,
        message: message.into(),
    }
}

/// `name` is the path as shown (escaped).
fn io_failure(name: &str, op: &str, error: &std::io::Error) -> Failure {
    if is_escape(error) {
        return failure(
            Kind::Outside,
            format!("{op} {name}: path is outside the workspace"),
        );
    }
    let kind = match error.kind() {
        std::io::ErrorKind::NotFound => Kind::NotExist,
        std::io::ErrorKind::PermissionDenied => Kind::Permission,
        std::io::ErrorKind::InvalidInput | std::io::ErrorKind::NotADirectory => Kind::Invalid,
        _ => match error.raw_os_error() {
            Some(libc::EINVAL) | Some(libc::ENOTDIR) | Some(libc::ELOOP) => Kind::Invalid,
            _ => Kind::Other,
        },
    };
    failure(kind, format!("{op} {name}: {error}"))
}

/// Answer a read of `uri`: the JSON document (an `error` document on failure).
pub(crate) fn read(workspace: &Workspace, uri: &str) -> String {
    let document = match parse(uri).and_then(|(op, name)| answer(workspace, op, &name)) {
        Ok(document) => document,
        Err(failure) => {
            let mut message = failure.message;
            if message.len() > MAX_MESSAGE_BYTES {
                let mut cut = MAX_MESSAGE_BYTES;
                while !message.is_char_boundary(cut) {
                    cut -= 1;
                }
                message.truncate(cut);
            }
            json!({"error": {"kind": failure.kind.as_str(), "message": message}})
        }
    };
    document.to_string()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Stat,
    Lstat,
    Readdir,
    Readlink,
    Read,
}

/// The op and the name of a files URI; everything else about it is refused.
fn parse(uri: &str) -> Result<(Op, PathBuf), Failure> {
    let invalid = |why: &str| {
        failure(
            Kind::Invalid,
            format!("{why}: {}", names::show_path_bytes(uri.as_bytes())),
        )
    };
    let Some(rest) = uri.strip_prefix(SCHEME_PREFIX) else {
        return Err(invalid(
            "not a workspace files uri (agentworkspace:///{op}?path=...)",
        ));
    };
    if rest.contains('#') {
        return Err(invalid("a files uri has no fragment"));
    }
    let (op, query) = rest.split_once('?').unwrap_or((rest, ""));
    let op = match op {
        "stat" => Op::Stat,
        "lstat" => Op::Lstat,
        "readdir" => Op::Readdir,
        "readlink" => Op::Readlink,
        "read" => Op::Read,
        _ => {
            return Err(invalid(
                "unknown op (stat, lstat, readdir, readlink or read)",
            ));
        }
    };
    let mut paths = Vec::new();
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if key != "path" {
            return Err(invalid("the only query parameter is path"));
        }
        paths.push(value);
    }
    let [value] = paths.as_slice() else {
        return Err(invalid("exactly one path parameter is needed"));
    };
    let bytes = percent_decode(value).ok_or_else(|| invalid("bad percent-encoding"))?;
    let name = String::from_utf8(bytes).map_err(|_| invalid("the path is not UTF-8"))?;
    // A name the tools show quoted (not UTF-8, control characters) is asked
    // for in that quoted form.
    let bytes = names::parse(&name).map_err(|why| invalid(&why))?;
    check_name(&bytes)?;
    Ok((op, PathBuf::from(std::ffi::OsStr::from_bytes(&bytes))))
}

/// Go's `fs.ValidPath`, with absolute and climbing names told apart as outside.
fn check_name(name: &[u8]) -> Result<(), Failure> {
    let shown = names::show_path_bytes(name);
    if name.starts_with(b"/") || name.split(|byte| *byte == b'/').any(|part| part == b"..") {
        return Err(failure(
            Kind::Outside,
            format!("path is outside the workspace: {shown}"),
        ));
    }
    if name == b"." {
        return Ok(());
    }
    if name.contains(&0)
        || name
            .split(|byte| *byte == b'/')
            .any(|part| part.is_empty() || part == b".")
    {
        return Err(failure(Kind::Invalid, format!("invalid path: {shown}")));
    }
    Ok(())
}

fn percent_decode(text: &str) -> Option<Vec<u8>> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        match bytes[index] {
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(index + 1..index + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                index += 3;
            }
            b'+' => {
                out.push(b' ');
                index += 1;
            }
            byte => {
                out.push(byte);
                index += 1;
            }
        }
    }
    Some(out)
}

fn answer(workspace: &Workspace, op: Op, path: &Path) -> Result<Value, Failure> {
    let shown = names::show_path(path);
    let name: &str = &shown;
    match op {
        Op::Stat => {
            let metadata = workspace
                .metadata(path)
                .map_err(|e| io_failure(name, "stat", &e))?;
            Ok(json!({"info": info(&base_name(path), &metadata)}))
        }
        Op::Lstat => {
            let metadata = workspace
                .symlink_metadata(path)
                .map_err(|e| io_failure(name, "lstat", &e))?;
            Ok(json!({"info": info(&base_name(path), &metadata)}))
        }
        Op::Readdir => {
            let dir = workspace
                .open_dir(path)
                .map_err(|e| io_failure(name, "readdir", &e))?;
            let mut entries = Vec::new();
            for entry in dir.entries().map_err(|e| io_failure(name, "readdir", &e))? {
                let Ok(entry) = entry else { continue };
                if entries.len() == MAX_DIR_ENTRIES {
                    return Err(failure(
                        Kind::Other,
                        format!("readdir {name}: more than {MAX_DIR_ENTRIES} entries"),
                    ));
                }
                let file_name = entry.file_name();
                // An entry removed during the listing is skipped.
                let Ok(metadata) = dir.symlink_metadata(&file_name) else {
                    continue;
                };
                entries.push(info(&names::show(file_name.as_bytes()), &metadata));
            }
            Ok(json!({"entries": entries}))
        }
        Op::Readlink => {
            if path == Path::new(".") {
                return Err(failure(Kind::Invalid, "readlink .: not a link"));
            }
            let target = workspace
                .dir()
                .read_link_contents(path)
                .map_err(|e| io_failure(name, "readlink", &e))?;
            Ok(json!({"target": names::show_path(&target)}))
        }
        Op::Read => {
            let (file, metadata) = workspace.open_regular(path).map_err(|error| match error {
                FileError::Io(error) => io_failure(name, "read", &error),
                FileError::Directory | FileError::NotRegular => {
                    failure(Kind::Invalid, format!("read {name}: not a regular file"))
                }
            })?;
            if metadata.len() > MAX_FILE_BYTES {
                return Err(failure(
                    Kind::Other,
                    format!(
                        "read {name}: {} bytes; at most {MAX_FILE_BYTES}",
                        metadata.len()
                    ),
                ));
            }
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut std::io::Read::take(file, MAX_FILE_BYTES), &mut data)
                .map_err(|e| io_failure(name, "read", &e))?;
            if data.is_empty() {
                return Ok(json!({}));
            }
            Ok(json!({"data": base64::engine::general_purpose::STANDARD.encode(&data)}))
        }
    }
}

/// The last name of `path`, as shown (`.` for the root).
fn base_name(path: &Path) -> String {
    match path.file_name() {
        Some(name) => names::show(name.as_bytes()).into_owned(),
        None => path.to_string_lossy().into_owned(),
    }
}

/// One file's description as Go's `fs.FileInfo` serialises for the wire.
fn info(name: &str, metadata: &Metadata) -> Value {
    json!({
        "name": name,
        "size": metadata.len(),
        "mode": go_mode(metadata),
        "modTime": rfc3339_nanos(metadata.mtime(), metadata.mtime_nsec()),
    })
}

/// Go's `fs.FileMode` bits for `metadata`: permissions low, type bits high.
fn go_mode(metadata: &Metadata) -> u32 {
    const DIR: u32 = 1 << 31;
    const SYMLINK: u32 = 1 << 27;
    const DEVICE: u32 = 1 << 26;
    const NAMED_PIPE: u32 = 1 << 25;
    const SOCKET: u32 = 1 << 24;
    const SETUID: u32 = 1 << 23;
    const SETGID: u32 = 1 << 22;
    const CHAR_DEVICE: u32 = 1 << 21;
    const STICKY: u32 = 1 << 20;
    let raw = metadata.permissions().mode();
    let mut mode = raw & 0o777;
    mode |= match raw & libc::S_IFMT {
        libc::S_IFDIR => DIR,
        libc::S_IFLNK => SYMLINK,
        libc::S_IFBLK => DEVICE,
        libc::S_IFCHR => DEVICE | CHAR_DEVICE,
        libc::S_IFIFO => NAMED_PIPE,
        libc::S_IFSOCK => SOCKET,
        _ => 0,
    };
    if raw & libc::S_ISUID != 0 {
        mode |= SETUID;
    }
    if raw & libc::S_ISGID != 0 {
        mode |= SETGID;
    }
    if raw & libc::S_ISVTX != 0 {
        mode |= STICKY;
    }
    mode
}

/// Go's `time.RFC3339Nano` in UTC: trailing zeros of the fraction dropped.
pub(crate) fn rfc3339_nanos(seconds: i64, nanos: i64) -> String {
    let days = seconds.div_euclid(86_400);
    let of_day = seconds.rem_euclid(86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let mut text = format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        of_day / 3600,
        of_day % 3600 / 60,
        of_day % 60
    );
    if nanos > 0 {
        let fraction = format!("{nanos:09}");
        text.push('.');
        text.push_str(fraction.trim_end_matches('0'));
    }
    text.push('Z');
    text
}

#[cfg(test)]
mod tests;
