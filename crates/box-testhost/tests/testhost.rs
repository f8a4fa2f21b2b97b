//! `box-testhost` is the `box` command line with the fake backend; having
//! an integration test here makes cargo build it for the workspace's tests.

#[test]
fn the_testhost_serves_with_the_fake_backend() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_box-testhost"))
        .args(["serve", "--backend", "fake"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
