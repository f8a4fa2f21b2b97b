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
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md's code map does not name: {missing:?}"
    );
}
