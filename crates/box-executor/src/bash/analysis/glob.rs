//! Glob expansion for `ls` arguments: the names a `*`/`?` pattern matches
//! beneath a directory, as bash would expand it (in the C and the UTF-8
//! locale both).

use std::path::Path;

/// The most names one `ls` glob may expand to before the stage asks instead.
const MAX_GLOB_MATCHES: usize = 1000;

/// The names `pattern` (relative, `*` and `?` only) matches beneath `dir`,
/// relative to it, sorted.
pub(super) fn expand_glob(dir: &Path, pattern: &str) -> Result<Vec<String>, String> {
    if pattern.starts_with('/') {
        return Err(format!("the absolute glob {pattern}"));
    }
    let mut found = vec![String::new()];
    for component in pattern.split('/') {
        if component.is_empty() {
            continue;
        }
        let mut next = Vec::new();
        for prefix in &found {
            let joined = |name: &str| {
                if prefix.is_empty() {
                    name.to_owned()
                } else {
                    format!("{prefix}/{name}")
                }
            };
            if !component.contains(['*', '?']) {
                next.push(joined(component));
                continue;
            }
            let Ok(entries) = std::fs::read_dir(dir.join(prefix)) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name();
                let bytes = std::os::unix::ffi::OsStrExt::as_bytes(name.as_os_str());
                if bytes.first() == Some(&b'.') && !component.starts_with('.') {
                    continue;
                }
                let text = String::from_utf8_lossy(bytes);
                let chars: Vec<char> = text.chars().collect();
                if !glob_matches(component.as_bytes(), bytes)
                    && !glob_matches(component.as_bytes(), &chars)
                {
                    continue;
                }
                let Some(name) = name.to_str() else {
                    return Err(format!("{pattern} matches a name that is not UTF-8"));
                };
                next.push(joined(name));
                if next.len() > MAX_GLOB_MATCHES {
                    return Err(format!(
                        "{pattern} matches more than {MAX_GLOB_MATCHES} names"
                    ));
                }
            }
        }
        found = next;
    }
    // Every literal component must exist for bash to keep the match.
    found.retain(|name| !name.is_empty() && dir.join(name).symlink_metadata().is_ok());
    found.sort();
    Ok(found)
}

/// A `*`/`?` pattern over bytes or characters (`?` is one unit of either).
fn glob_matches<T: Copy + Into<u32>>(pattern: &[u8], name: &[T]) -> bool {
    match pattern.split_first() {
        None => name.is_empty(),
        Some((b'*', rest)) => (0..=name.len()).any(|skip| glob_matches(rest, &name[skip..])),
        Some((b'?', rest)) => !name.is_empty() && glob_matches(rest, &name[1..]),
        Some((literal, rest)) => name.split_first().is_some_and(|(first, tail)| {
            (*first).into() == u32::from(*literal) && glob_matches(rest, tail)
        }),
    }
}

#[cfg(test)]
mod tests;
