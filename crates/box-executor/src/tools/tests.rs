use std::os::unix::fs::symlink;

use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::testing::{call, context, map};
use super::*;

fn claim(context: &Context, tool: &str, arguments: Value) -> Result<Value, String> {
    facts(context, tool, &map(arguments))
        .expect("a known tool")
        .map(|facts| serde_json::to_value(facts).unwrap())
}

#[test]
fn file_facts_rewrite_with_a_stamp_that_the_call_verifies() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "hi\n").unwrap();
    let context = context(dir.path());
    let answer = claim(
        &context,
        "read",
        json!({"path": "notes.txt", "dax_stamp": "forged"}),
    )
    .unwrap();
    assert_eq!(
        answer["calls"],
        json!([{"tool": "", "args": {"path": "notes.txt"}, "text": "notes.txt"}])
    );
    let rewrite = answer["rewrite"].clone();
    let stamp = rewrite["dax_stamp"].as_str().unwrap();
    assert_eq!(stamp.len(), 64);
    assert_ne!(stamp, "forged");
    assert_eq!(
        call(&context, "read", rewrite.clone()),
        Ok("     1\thi\n".to_owned())
    );
    // A stamp for another tool, or the model's own, does not verify.
    let mut forged = rewrite.clone();
    forged["dax_stamp"] = json!("00".repeat(32));
    assert_eq!(
        call(&context, "read", forged),
        Err(STAMP_MISMATCH.to_owned())
    );
    let mut empty = rewrite.clone();
    empty["dax_stamp"] = json!("");
    assert_eq!(call(&context, "read", empty), Ok("     1\thi\n".to_owned()));
    let mut as_ls = rewrite;
    as_ls.as_object_mut().unwrap().remove("path");
    assert_eq!(call(&context, "ls", as_ls), Err(STAMP_MISMATCH.to_owned()));
}

#[test]
fn a_stamp_is_refused_once_the_path_leads_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "hi\n").unwrap();
    std::fs::write(dir.path().join("secret"), "s3cret\n").unwrap();
    let context = context(dir.path());
    let rewrite = claim(&context, "read", json!({"path": "notes.txt"})).unwrap()["rewrite"].clone();
    std::fs::remove_file(dir.path().join("notes.txt")).unwrap();
    symlink("secret", dir.path().join("notes.txt")).unwrap();
    assert_eq!(
        call(&context, "read", rewrite),
        Err(STAMP_MISMATCH.to_owned())
    );
}

#[test]
fn defaults_and_outside_paths_in_facts() {
    let dir = tempfile::tempdir().unwrap();
    let context = context(dir.path());
    assert_eq!(
        claim(&context, "ls", json!({})).unwrap()["calls"],
        json!([{"tool": "", "args": {"path": "."}, "text": "."}])
    );
    assert_eq!(
        claim(&context, "grep", json!({"pattern": "x", "path": ""})).unwrap()["calls"],
        json!([{"tool": "", "args": {"path": "."}, "text": "."}])
    );
    assert_eq!(
        claim(&context, "read", json!({"path": "/etc/passwd"})).unwrap()["calls"],
        json!([{"tool": "", "args": {"path": "$(...) /etc/passwd"}, "text": "/etc/passwd"}])
    );
    assert_eq!(
        claim(&context, "read", json!({"path": "a", "Path": ".env"})),
        Err(r#"argument "Path" is "path" in another case; write it once, as "path""#.to_owned())
    );
}

#[test]
fn schemas_follow_the_reference() {
    let read = spec("read").unwrap();
    assert_eq!(
        Value::Object(input_schema(read)),
        json!({"type": "object", "properties": {
            "path": {"type": "string", "description": "File path, relative to the workspace or absolute inside it"},
            "offset": {"type": "integer", "description": "1-based line to start at (default 1)"},
            "limit": {"type": "integer", "description": "Maximum lines to return (default 2000)"},
            "dax_stamp": {"type": "string", "description": "Set by dax; leave it out"}},
         "required": ["path"]})
    );
    assert_eq!(input_schema(spec("ls").unwrap())["required"], json!([]));
    assert_eq!(
        description(read, 2 * 1024 * 1024),
        "Read a file. Returns numbered lines. Use offset and limit for large files; only the first 2048 KiB of a file can be read, so use grep to find a line in a larger one."
    );
    assert_eq!(
        listing_flags(spec("bash").unwrap()),
        json!({"facts": true, "replay": true, "sequential": true})
    );
    assert_eq!(
        listing_flags(spec("edit").unwrap()),
        json!({"facts": true, "replay": true})
    );
    let names: Vec<(&str, &str)> = TOOLS
        .iter()
        .map(|tool| (tool.name, tool.extension))
        .collect();
    assert_eq!(
        names,
        [
            ("read", "dax-coding"),
            ("write", "dax-coding"),
            ("edit", "dax-coding"),
            ("glob", "dax-coding"),
            ("grep", "dax-coding"),
            ("ls", "dax-coding"),
            ("bash", "dax-coding"),
            ("copy", "box-namespace"),
            ("move", "box-namespace"),
            ("remove", "box-namespace"),
        ]
    );
    assert_eq!(
        Value::Object(input_schema(spec("copy").unwrap())),
        json!({"type": "object", "properties": {
            "source": {"type": "string", "description": "The path to take, relative to the workspace or absolute inside it"},
            "destination": {"type": "string", "description": "The new path, relative to the workspace or absolute inside it; nothing may be there yet"},
            "dax_stamp": {"type": "string", "description": "Set by dax; leave it out"}},
         "required": ["source", "destination"]})
    );
}
