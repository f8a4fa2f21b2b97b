//! The reference's traps (opening-the-session.md §2.3, §2.4): a token only
//! behind `includeIf`, the `[HTTP "https://x"] ExtraHeader` spelling, a
//! continued value, `https://user:tok@host` in `pushurl`; and the bounds:
//! nothing read outside the workspace, include depth, sizes.

use std::fs;
use std::path::Path;

use pretty_assertions::assert_eq;

use super::*;

const TOKEN: &str = "ghs_PersistedT0kenValue0123456789";

/// `x-access-token:TOKEN` in base64, as actions/checkout writes it.
fn basic_credentials() -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(format!("x-access-token:{TOKEN}"))
}

fn write(root: &Path, path: &str, content: &str) {
    let path = root.join(path);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, content).unwrap();
}

/// Each finding as `file:line key kind`, and whether TOKEN is among its
/// secrets.
fn summary(scan: &Scan) -> Vec<String> {
    scan.findings
        .iter()
        .map(|finding| {
            let has_token = finding
                .secrets
                .iter()
                .any(|secret| secret == TOKEN.as_bytes());
            format!(
                "{}:{} {} {:?}{}",
                finding.file.display(),
                finding.line,
                finding.key,
                finding.kind,
                if has_token { " TOKEN" } else { "" }
            )
        })
        .collect()
}

fn scan(root: &Path) -> Scan {
    scan_workspace(root).unwrap()
}

#[test]
fn checkout_extraheader_is_found_and_decoded_to_the_token() {
    let workspace = tempfile::tempdir().unwrap();
    write(
        workspace.path(),
        ".git/config",
        &format!(
            "[core]\n\trepositoryformatversion = 0\n[http \"https://github.com/\"]\n\textraheader = AUTHORIZATION: basic {}\n",
            basic_credentials()
        ),
    );
    let scan = scan(workspace.path());
    assert_eq!(
        summary(&scan),
        [".git/config:4 http.https://github.com/.extraheader ExtraHeader TOKEN"]
    );
    assert_eq!(scan.unread, []);
}

#[test]
fn token_only_behind_include_if_is_found() {
    let workspace = tempfile::tempdir().unwrap();
    write(
        workspace.path(),
        ".git/config",
        "[includeIf \"gitdir:/home/runner/work/\"]\n\tpath = ../.ci/credentials.config\n[include]\n\tpath = ~/.gitconfig-extra\n",
    );
    write(
        workspace.path(),
        ".ci/credentials.config",
        &format!(
            "[http]\n\textraheader = AUTHORIZATION: basic {}\n",
            basic_credentials()
        ),
    );
    let scan = scan(workspace.path());
    assert_eq!(
        summary(&scan),
        [".ci/credentials.config:2 http.extraheader ExtraHeader TOKEN"]
    );
    assert_eq!(
        scan.unread,
        [Unread {
            path: PathBuf::from("~/.gitconfig-extra"),
            reason: UnreadReason::OutsideWorkspace
        }]
    );
}

#[test]
fn upper_case_spelling_and_continued_values_are_found() {
    let workspace = tempfile::tempdir().unwrap();
    let credentials = basic_credentials();
    let (first, second) = credentials.split_at(10);
    write(
        workspace.path(),
        ".git/config",
        &format!(
            "[HTTP \"https://x\"]\n\tExtraHeader = \"AUTHORIZATION: basic {first}\\\n{second}\"\n"
        ),
    );
    assert_eq!(
        summary(&scan(workspace.path())),
        [".git/config:2 http.https://x.extraheader ExtraHeader TOKEN"]
    );
}

#[test]
fn url_credentials_in_any_key_or_subsection_are_found_and_hidden_in_the_key() {
    let workspace = tempfile::tempdir().unwrap();
    write(
        workspace.path(),
        ".git/config",
        &format!(
            concat!(
                "[remote \"origin\"]\n",
                "\turl = https://github.com/o/r.git\n",
                "\tpushurl = https://user:{token}@github.com/o/r.git\n",
                "[url \"https://x-access-token:{token}@github.com/\"]\n",
                "\tinsteadOf = https://github.com/\n",
                "[http]\n",
                "\tproxy = http://proxyuser:{token}@proxy:3128 ; comment\n",
                "[remote \"ssh\"]\n",
                "\turl = ssh://git@github.com/o/r.git\n",
            ),
            token = TOKEN
        ),
    );
    assert_eq!(
        summary(&scan(workspace.path())),
        [
            ".git/config:3 remote.origin.pushurl UrlCredentials TOKEN",
            ".git/config:5 url.https://x-access-token:***@github.com/.insteadof UrlCredentials TOKEN",
            ".git/config:7 http.proxy UrlCredentials TOKEN",
        ]
    );
}

#[test]
fn credential_helpers_store_file_and_inline_command_are_found() {
    let workspace = tempfile::tempdir().unwrap();
    write(
        workspace.path(),
        ".git/config",
        &format!(
            "[credential]\n\thelper = store --file=.git/stored\n[credential \"https://other\"]\n\thelper = \"!f() {{ echo password={TOKEN}; }}; f\"\n"
        ),
    );
    write(
        workspace.path(),
        ".git/stored",
        &format!("https://user:{TOKEN}@github.com\nhttps://plain@example.com\n"),
    );
    assert_eq!(
        summary(&scan(workspace.path())),
        [
            ".git/stored:1 https://user:***@github.com CredentialStore TOKEN",
            ".git/config:4 credential.https://other.helper InlineHelper TOKEN",
        ]
    );
}

#[test]
fn credential_files_anywhere_in_the_tree_are_found() {
    let workspace = tempfile::tempdir().unwrap();
    write(
        workspace.path(),
        "sub/dir/.git-credentials",
        &format!("https://u:{TOKEN}@host\n"),
    );
    write(
        workspace.path(),
        ".netrc",
        &format!("machine api.example.com login me password {TOKEN}\n"),
    );
    write(
        workspace.path(),
        ".gitmodules",
        &format!("[submodule \"lib\"]\n\tpath = lib\n\turl = https://u:{TOKEN}@host/lib.git\n"),
    );
    assert_eq!(
        summary(&scan(workspace.path())),
        [
            ".gitmodules:3 submodule.lib.url UrlCredentials TOKEN",
            ".netrc:1 machine api.example.com Netrc TOKEN",
            "sub/dir/.git-credentials:1 https://u:***@host CredentialStore TOKEN",
        ]
    );
}

#[test]
fn worktrees_gitfiles_and_submodule_git_dirs_are_scanned() {
    let workspace = tempfile::tempdir().unwrap();
    let url = format!("[remote \"o\"]\n\turl = https://u:{TOKEN}@h/r\n");
    write(
        workspace.path(),
        ".git/worktrees/feature/config.worktree",
        &url,
    );
    write(workspace.path(), ".git/modules/lib/config", &url);
    write(
        workspace.path(),
        ".git/modules/lib/modules/inner/config",
        &url,
    );
    // A nested checkout whose `.git` is a file pointing inside the workspace.
    write(
        workspace.path(),
        "vendor/dep/.git",
        "gitdir: ../../.git/modules/dep\n",
    );
    write(workspace.path(), ".git/modules/dep/config", &url);
    // A linked worktree's git directory names its repository's in `commondir`.
    write(
        workspace.path(),
        "linked/.git",
        "gitdir: ../repo/.git/worktrees/linked\n",
    );
    write(
        workspace.path(),
        "repo/.git/worktrees/linked/commondir",
        "../..\n",
    );
    write(workspace.path(), "repo/.git/config", &url);
    let files: Vec<String> = scan(workspace.path())
        .findings
        .iter()
        .map(|finding| finding.file.display().to_string())
        .collect();
    assert_eq!(
        files,
        [
            ".git/worktrees/feature/config.worktree",
            ".git/modules/lib/config",
            ".git/modules/lib/modules/inner/config",
            ".git/modules/dep/config",
            "repo/.git/config",
        ]
    );
}

#[test]
fn nothing_outside_the_workspace_is_read() {
    let outside = tempfile::tempdir().unwrap();
    write(
        outside.path(),
        "netrc",
        &format!("machine m password {TOKEN}\n"),
    );
    write(
        outside.path(),
        "config",
        &format!("[http]\n\textraheader = Authorization: Bearer {TOKEN}\n"),
    );
    let workspace = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("netrc"),
        workspace.path().join(".netrc"),
    )
    .unwrap();
    write(
        workspace.path(),
        ".git/config",
        &format!(
            "[include]\n\tpath = {}\n\tpath = ../../{}/config\n",
            outside.path().join("config").display(),
            outside.path().file_name().unwrap().to_string_lossy()
        ),
    );
    // A symbolic link to a directory outside is not walked into.
    std::os::unix::fs::symlink(outside.path(), workspace.path().join("linked")).unwrap();
    let scan = scan(workspace.path());
    assert_eq!(summary(&scan), Vec::<String>::new());
    assert_eq!(
        scan.unread
            .iter()
            .map(|unread| unread.reason.clone())
            .collect::<Vec<_>>(),
        [
            UnreadReason::OutsideWorkspace,
            UnreadReason::OutsideWorkspace,
            UnreadReason::OutsideWorkspace
        ]
    );
}

#[test]
fn include_chains_stop_at_gits_depth_and_cycles_end() {
    let workspace = tempfile::tempdir().unwrap();
    write(workspace.path(), ".git/config", "[include]\n\tpath = c1\n");
    for index in 1..=12 {
        write(
            workspace.path(),
            &format!(".git/c{index}"),
            &format!(
                "[include]\n\tpath = c{}\n[remote \"r{index}\"]\n\turl = https://u:{TOKEN}@h/\n",
                index + 1
            ),
        );
    }
    write(
        workspace.path(),
        ".git/cycle",
        "[include]\n\tpath = cycle\n",
    );
    write(
        workspace.path(),
        ".git/config.worktree",
        "[include]\n\tpath = cycle\n",
    );
    let scan = scan(workspace.path());
    // config includes c1 at depth 1 ... c10 at depth 10; c11 is too deep.
    assert_eq!(scan.findings.len(), 10);
    assert_eq!(
        scan.unread,
        [Unread {
            path: PathBuf::from(".git/c11"),
            reason: UnreadReason::TooDeep
        }]
    );
}

#[test]
fn limits_bound_what_is_read_and_say_so() {
    let workspace = tempfile::tempdir().unwrap();
    write(workspace.path(), ".netrc", &"x".repeat(2048));
    write(workspace.path(), "a/b/c/.netrc", "machine m password p\n");
    let limits = Limits {
        max_file_bytes: 1024,
        max_walk_depth: 2,
        ..Limits::default()
    };
    let scan = scan_workspace_with(workspace.path(), &limits).unwrap();
    assert_eq!(scan.findings, []);
    assert_eq!(
        scan.unread,
        [
            Unread {
                path: PathBuf::from(".netrc"),
                reason: UnreadReason::TooLarge { bytes: 2048 }
            },
            Unread {
                path: PathBuf::from("a/b/c"),
                reason: UnreadReason::WalkLimit
            },
        ]
    );
}

#[test]
fn a_config_git_would_refuse_is_reported_and_still_searched_for_urls() {
    let workspace = tempfile::tempdir().unwrap();
    write(
        workspace.path(),
        ".git/config",
        &format!(
            "[remote \"o\"]\n\turl = https://u:{TOKEN}@h/\n\tbroken line\n\tpushurl = https://u:other-secret-value@h/\n"
        ),
    );
    let scan = scan(workspace.path());
    assert_eq!(
        summary(&scan),
        [
            ".git/config:2 remote.o.url UrlCredentials TOKEN",
            ".git/config:4 (unparsable line) UrlCredentials",
        ]
    );
    assert_eq!(
        scan.unread,
        [Unread {
            path: PathBuf::from(".git/config"),
            reason: UnreadReason::Unparsable { line: 3 }
        }]
    );
}

#[test]
fn findings_never_show_secrets_in_debug_output() {
    let workspace = tempfile::tempdir().unwrap();
    write(
        workspace.path(),
        ".netrc",
        &format!("machine m password {TOKEN}\n"),
    );
    let scan = scan(workspace.path());
    assert!(!format!("{scan:?}").contains(TOKEN));
}

#[test]
fn a_missing_workspace_is_an_error_naming_it() {
    let error = scan_workspace(Path::new("/nonexistent/workspace")).unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("cannot scan workspace /nonexistent/workspace for persisted credentials")
    );
}
