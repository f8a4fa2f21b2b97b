//! `ls` globs.

use super::super::analyse;
use super::super::tests::{claim, is_auto_allowable, repository};
use super::*;

#[test]
fn ls_globs_are_expanded_and_checked() {
    let (temp, context) = repository();
    std::fs::write(temp.path().join("-la"), "").unwrap();
    std::fs::write(temp.path().join(".hidden"), "").unwrap();
    let analysis = analyse(&context, "ls -l *.txt i*/* -*").unwrap();
    assert_eq!(
        analysis.run.as_deref(),
        Some("'ls' '-l' -- 'notes.txt' 'internal/a.go' '-la'")
    );
    let analysis = analyse(&context, "ls *.none").unwrap();
    assert_eq!(analysis.run.as_deref(), Some("'ls' -- '*.none'"));
    // A link named with a two-byte character to /etc: `?` in UTF-8, `??` in C.
    std::os::unix::fs::symlink("/etc", temp.path().join("é")).unwrap();
    for line in ["ls ?", "ls ??", "ls *", "ls /etc/*", "ls ../*"] {
        assert!(
            !is_auto_allowable(&claim(&context, line).unwrap()),
            "{line}"
        );
    }
    assert!(glob_matches(b"?", &['é']));
    assert!(glob_matches(b"??", "é".as_bytes()));
    assert!(!glob_matches(b"?", "é".as_bytes()));
}
