//! Canary tests: each override is proven with real git. Every case first runs
//! its command without the neutralisation and asserts that the planted program
//! ran (so the fixture is live), then runs it neutralised and asserts it did not.

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use super::*;

struct Repo {
    _temp: tempfile::TempDir,
    dir: PathBuf,
    canaries: PathBuf,
    home: PathBuf,
}

impl Repo {
    fn new() -> Self {
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path().join("repo");
        let canaries = temp.path().join("canaries");
        let home = temp.path().join("home");
        for d in [&dir, &canaries, &home] {
            std::fs::create_dir(d).unwrap();
        }
        let repo = Self {
            _temp: temp,
            dir,
            canaries,
            home,
        };
        repo.plain(&["init", "-q"]);
        std::fs::write(repo.dir.join("f"), "one\n").unwrap();
        repo.plain(&["add", "f"]);
        repo.plain(&["commit", "-q", "-m", "init"]);
        repo
    }

    /// A program for `role` that records that it ran, then behaves enough
    /// like the real thing for git to go on (filters pass data through).
    fn evil(&self, role: &str) -> String {
        let path = self._temp.path().join(format!("evil-{role}"));
        let canary = self.canaries.join(role);
        let body = format!(
            "#!/bin/sh\ntouch '{}'\ncase '{role}' in clean|smudge) exec cat ;; textconv) exec cat \"$1\" ;; esac\nexit 0\n",
            canary.display()
        );
        std::fs::write(&path, body).unwrap();
        let mut permissions = std::fs::metadata(&path).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
        std::fs::set_permissions(&path, permissions).unwrap();
        path.display().to_string()
    }

    fn config(&self, key: &str, value: &str) {
        self.plain(&["config", key, value]);
    }

    fn base_env(&self) -> Vec<(OsString, OsString)> {
        vec![
            ("PATH".into(), std::env::var_os("PATH").unwrap_or_default()),
            ("HOME".into(), self.home.clone().into()),
            ("GIT_CONFIG_NOSYSTEM".into(), "1".into()),
            ("GIT_TERMINAL_PROMPT".into(), "0".into()),
            ("GIT_AUTHOR_NAME".into(), "a".into()),
            ("GIT_AUTHOR_EMAIL".into(), "a@example.com".into()),
            ("GIT_COMMITTER_NAME".into(), "a".into()),
            ("GIT_COMMITTER_EMAIL".into(), "a@example.com".into()),
        ]
    }

    fn run(
        &self,
        args: &[&str],
        stdin: &[u8],
        neutralise: Option<Vec<(String, String)>>,
    ) -> Output {
        let mut command = Command::new("git");
        command
            .args(args)
            .current_dir(&self.dir)
            .env_clear()
            .envs(self.base_env())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(vars) = neutralise {
            command.envs(vars);
        }
        let mut child = command.spawn().unwrap();
        let mut input = child.stdin.take().unwrap();
        let _ = input.write_all(stdin);
        drop(input);
        child.wait_with_output().unwrap()
    }

    fn plain(&self, args: &[&str]) -> Output {
        let output = self.run(args, b"", None);
        assert!(output.status.success(), "git {args:?}: {output:?}");
        output
    }

    fn fired(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.canaries)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    fn clear(&self) {
        for entry in std::fs::read_dir(&self.canaries).unwrap() {
            std::fs::remove_file(entry.unwrap().path()).unwrap();
        }
    }

    /// The control run fires a canary; the neutralised run fires none.
    fn check(&self, args: &[&str], stdin: &[u8]) {
        self.check_with(args, stdin, args);
    }

    /// As `check`, with the neutralised run using `guarded` (the same command
    /// with the flags the plan renderer adds).
    fn check_with(&self, args: &[&str], stdin: &[u8], guarded: &[&str]) {
        self.clear();
        let control = self.run(args, stdin, None);
        assert!(
            !self.fired().is_empty(),
            "control `git {args:?}` fired no canary, so the fixture is not live: {control:?}"
        );
        self.clear();
        let drivers = configured_drivers(&self.dir, &self.base_env()).unwrap();
        let output = self.run(
            guarded,
            stdin,
            Some(git_neutralisation_with_drivers(&drivers)),
        );
        assert_eq!(
            self.fired(),
            Vec::<String>::new(),
            "neutralised `git {guarded:?}` ran a planted program: {output:?}"
        );
    }

    fn change(&self) {
        std::fs::write(self.dir.join("f"), "two\n").unwrap();
    }
}

#[test]
fn fsmonitor_does_not_run() {
    let repo = Repo::new();
    repo.config("core.fsmonitor", &repo.evil("fsmonitor"));
    repo.check(&["status"], b"");
    repo.check(&["diff"], b"");
}

#[test]
fn pager_and_editor_are_cat_and_true() {
    let repo = Repo::new();
    repo.config("core.pager", &repo.evil("pager"));
    repo.config("core.editor", &repo.evil("editor"));
    repo.config("sequence.editor", &repo.evil("sequence"));
    // A pager only runs on a terminal; `git var` says which git would use.
    let var = |name: &str, neutralise| {
        let output = repo.run(&["var", name], b"", neutralise);
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    };
    assert!(var("GIT_PAGER", None).ends_with("evil-pager"));
    assert_eq!(var("GIT_PAGER", Some(git_neutralisation())), "cat");
    assert!(var("GIT_EDITOR", None).ends_with("evil-editor"));
    assert_eq!(var("GIT_EDITOR", Some(git_neutralisation())), "true");
    assert_eq!(
        var("GIT_SEQUENCE_EDITOR", Some(git_neutralisation())),
        "true"
    );
    repo.check(&["commit", "--allow-empty"], b"");
}

#[test]
fn hooks_do_not_run() {
    let repo = Repo::new();
    let evil = repo.evil("hook");
    for hook in [
        "pre-commit",
        "commit-msg",
        "post-commit",
        "post-checkout",
        "reference-transaction",
    ] {
        let path = repo.dir.join(".git/hooks").join(hook);
        std::fs::write(&path, format!("#!/bin/sh\nexec {evil}\n")).unwrap();
        let mut permissions = std::fs::metadata(&path).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
        std::fs::set_permissions(&path, permissions).unwrap();
    }
    repo.check(&["commit", "--allow-empty", "-m", "x"], b"");
    repo.check(&["checkout", "-q", "-b", "other"], b"");
    // A hooks path of the repository's choosing.
    std::fs::rename(repo.dir.join(".git/hooks"), repo.dir.join("hooks")).unwrap();
    repo.config("core.hooksPath", "hooks");
    repo.check(&["commit", "--allow-empty", "-m", "y"], b"");
}

#[test]
fn diff_external_needs_no_ext_diff() {
    let repo = Repo::new();
    repo.config("diff.external", &repo.evil("external"));
    repo.change();
    // diff.external cannot be emptied (git runs ""), so the flag is the guard.
    repo.check_with(&["diff"], b"", &["diff", "--no-ext-diff", "--no-textconv"]);
}

/// Issue 8, item 6: `diff.external` must not run in a stamped run, whose line
/// (outside the subset) runs as typed, without `--no-ext-diff`.
#[test]
fn diff_external_does_not_run_where_configured() {
    let repo = Repo::new();
    repo.config("diff.external", &repo.evil("external"));
    repo.change();
    assert!(
        configured_drivers(&repo.dir, &repo.base_env())
            .unwrap()
            .diff_external
    );
    repo.check(&["diff"], b"");
    repo.check(&["show", "--ext-diff", "HEAD"], b"");
    // The diff fails loudly instead, and says why.
    let drivers = configured_drivers(&repo.dir, &repo.base_env()).unwrap();
    let output = repo.run(
        &["diff"],
        b"",
        Some(git_neutralisation_with_drivers(&drivers)),
    );
    assert!(!output.status.success(), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("diff.external is not run here"), "{stderr}");
    // --no-ext-diff still diffs.
    let output = repo.run(
        &["diff", "--no-ext-diff"],
        b"",
        Some(git_neutralisation_with_drivers(&drivers)),
    );
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("+two"),
        "{output:?}"
    );
}

#[test]
fn attribute_drivers_do_not_run() {
    let repo = Repo::new();
    std::fs::write(
        repo.dir.join(".gitattributes"),
        "* filter=x diff=x merge=x\n",
    )
    .unwrap();
    repo.config("filter.x.clean", &repo.evil("clean"));
    repo.config("filter.x.smudge", &repo.evil("smudge"));
    repo.config("filter.x.process", &repo.evil("process"));
    repo.config("diff.x.textconv", &repo.evil("textconv"));
    repo.config("diff.x.command", &repo.evil("command"));
    // A driver pulled in through an include is found too.
    std::fs::write(
        repo.dir.join(".git/extra"),
        format!("[filter \"y.z\"]\n\tclean = {}\n", repo.evil("included")),
    )
    .unwrap();
    repo.config("include.path", "extra");
    assert_eq!(
        configured_drivers(&repo.dir, &repo.base_env()).unwrap(),
        Drivers {
            names: vec!["x".to_owned(), "y.z".to_owned()],
            diff_external: false
        }
    );
    repo.change();
    repo.check(&["status"], b"");
    repo.check(&["add", "-A"], b"");
    repo.check_with(
        &["diff", "HEAD"],
        b"",
        &["diff", "--no-ext-diff", "--no-textconv", "HEAD"],
    );
    // With every driver emptied, even the unguarded forms run nothing.
    repo.check(&["diff", "HEAD"], b"");
    repo.check(&["log", "-p"], b"");
    let drivers = configured_drivers(&repo.dir, &repo.base_env()).unwrap();
    let commit = repo.run(
        &["commit", "-q", "-m", "x"],
        b"",
        Some(git_neutralisation_with_drivers(&drivers)),
    );
    assert!(commit.status.success(), "{commit:?}");
    std::fs::remove_file(repo.dir.join("f")).unwrap();
    repo.check(&["checkout", "--", "f"], b"");
}

/// A subsection keeps its case (`[filter "LFS"]` is not `filter.lfs`), so a
/// driver named in capitals is found, and overridden, under its own name.
#[test]
fn drivers_named_in_capitals_do_not_run() {
    let repo = Repo::new();
    std::fs::write(repo.dir.join(".gitattributes"), "* filter=LFS diff=LFS\n").unwrap();
    repo.config("filter.LFS.clean", &repo.evil("clean"));
    repo.config("diff.LFS.textconv", &repo.evil("textconv"));
    assert_eq!(
        configured_drivers(&repo.dir, &repo.base_env()).unwrap(),
        Drivers {
            names: vec!["LFS".to_owned()],
            diff_external: false
        }
    );
    repo.change();
    repo.check(&["add", "-A"], b"");
    repo.check(&["diff", "HEAD"], b"");
    // Section and key are case-insensitive; only the subsection is not.
    let mut drivers = Drivers::default();
    drivers.add_key("FILTER.Mixed.Clean");
    drivers.add_key("Diff.External");
    assert_eq!(
        drivers,
        Drivers {
            names: vec!["Mixed".to_owned()],
            diff_external: true
        }
    );
}

#[test]
fn credential_helpers_do_not_run() {
    let repo = Repo::new();
    repo.config("credential.helper", &repo.evil("helper"));
    repo.config(
        "credential.https://example.com.helper",
        &repo.evil("url-helper"),
    );
    repo.check(
        &["credential", "fill"],
        b"protocol=https\nhost=example.com\n\n",
    );
}

#[test]
fn askpass_does_not_run() {
    let repo = Repo::new();
    repo.config("core.askPass", &repo.evil("askpass"));
    repo.check(
        &["credential", "fill"],
        b"protocol=https\nhost=example.com\n\n",
    );
}

#[test]
fn signing_programs_do_not_run() {
    let repo = Repo::new();
    repo.config("commit.gpgSign", "true");
    repo.config("gpg.program", &repo.evil("gpg"));
    repo.check(&["commit", "--allow-empty", "-m", "x"], b"");
    repo.config("tag.gpgSign", "true");
    repo.check(&["tag", "-m", "x", "v1"], b"");
    repo.config("log.showSignature", "true");
    repo.config("gpg.format", "ssh");
    repo.config("gpg.ssh.program", &repo.evil("gpg-ssh"));
    repo.config("user.signingKey", "key::ssh-ed25519 AAAA");
    repo.check(&["commit", "--allow-empty", "-m", "y"], b"");
}

#[test]
fn ssh_command_is_the_real_ssh() {
    let repo = Repo::new();
    repo.config("core.sshCommand", &repo.evil("ssh"));
    // Loopback port 1: the real ssh is refused at once; the planted one must not run.
    repo.check(&["ls-remote", "ssh://127.0.0.1:1/x"], b"");
}

#[test]
fn ext_transport_is_refused() {
    let repo = Repo::new();
    repo.config("protocol.ext.allow", "always");
    let evil = repo.evil("ext");
    let url = format!("ext::{evil}");
    repo.check(&["ls-remote", &url], b"");
    repo.config("protocol.allow", "always");
    repo.check(&["ls-remote", &url], b"");
}

#[test]
fn driver_names_come_from_config_keys() {
    let output = b"filter.lfs.clean\0filter.lfs.smudge\0diff.my.driver.textconv\0merge.x.driver\0";
    assert_eq!(
        Drivers::from_config_keys(output).names,
        ["lfs", "my.driver", "x"]
    );
}

#[test]
fn driver_names_are_the_subsection() {
    assert_eq!(driver_name("filter.a.b.clean").as_deref(), Some("a.b"));
    assert_eq!(driver_name("diff.x.textconv").as_deref(), Some("x"));
    assert_eq!(driver_name("diff.external"), None);
}

#[test]
fn neutralisation_counts_its_keys() {
    let vars = git_neutralisation();
    let count: usize = vars
        .iter()
        .find(|(name, _)| name == "GIT_CONFIG_COUNT")
        .unwrap()
        .1
        .parse()
        .unwrap();
    let keys = vars
        .iter()
        .filter(|(name, _)| name.starts_with("GIT_CONFIG_KEY_"))
        .count();
    assert_eq!(count, keys);
    assert_eq!(
        vars[1],
        ("GIT_CONFIG_KEY_0".into(), "core.fsmonitor".into())
    );
    assert!(vars.contains(&("GIT_CONFIG_KEY_7".into(), "gpg.ssh.program".into())));
    for plain in [
        "GIT_TERMINAL_PROMPT",
        "GIT_PAGER",
        "PAGER",
        "GIT_OPTIONAL_LOCKS",
        "GIT_NO_LAZY_FETCH",
    ] {
        assert!(vars.iter().any(|(name, _)| name == plain), "{plain}");
    }
}

#[test]
fn neutralised_git_stays_usable() {
    let repo = Repo::new();
    let neutralised = || Some(git_neutralisation());
    // Local clones (protocol.file back to `user`) and https/ssh transports work.
    let clone = repo.run(&["clone", "-q", ".", "../copy"], b"", neutralised());
    assert!(clone.status.success(), "{clone:?}");
    let https = repo.run(&["ls-remote", "https://127.0.0.1:1/x"], b"", neutralised());
    let stderr = String::from_utf8_lossy(&https.stderr);
    assert!(!stderr.contains("not allowed"), "{stderr}");
    // Ordinary commands behave: status, diff, log, commit.
    repo.change();
    for args in [
        &["status", "-s"][..],
        &["diff"],
        &["log", "--oneline"],
        &["commit", "-qam", "x"],
    ] {
        let output = repo.run(args, b"", neutralised());
        assert!(output.status.success(), "git {args:?}: {output:?}");
    }
}
