//! Box's own seccomp layer: a deny-list filter the executor installs on itself
//! (after no_new_privs, before it serves), stacked on whatever the engine
//! applied. Filters stack and the strictest answer wins, so this can only take
//! away: on Docker it closes what the engine's default profile of this era
//! lets through (io_uring, `AF_VSOCK`, ptrace of the executor); on the local
//! backend, where nothing else filters syscalls, it is the whole syscall layer.
//! It also makes the executor non-dumpable, so a same-uid child can neither
//! ptrace it nor read its `/proc/<pid>/mem|environ|fd`.
//!
//! The filter is inherited by every child, so everything a unit runs lives
//! under it. Every rule answers `EPERM` unless the table says otherwise; cases
//! are those of `security.md` (§ b, C = container escape).
//!
//! | Rule | Answer | Reason |
//! | --- | --- | --- |
//! | arch ≠ x86_64 (i386 `int 0x80`, incl. `socketcall`) | kill process | C32: the filter is per-arch; a foreign-arch call would bypass every argument check, so it fails closed |
//! | nr ≥ `0x40000000` (x32 ABI) | `ENOSYS` | same bypass through the x32 numbering; `ENOSYS` is what kernels without x32 answer |
//! | `clone3` | `ENOSYS` | C28: its flags sit behind a pointer seccomp cannot read; libc falls back to `clone` on `ENOSYS` |
//! | `clone` with any `CLONE_NEW*` flag | `EPERM` | C28: new namespaces (a user namespace grants capabilities within it) |
//! | `unshare` with any `CLONE_NEW*` flag, `setns` | `EPERM` | C28 (`unshare(CLONE_FILES)` and the like stay allowed) |
//! | `mount`, `umount2`, `pivot_root`, `fsopen`, `fsconfig`, `fsmount`, `fspick`, `move_mount`, `open_tree`, `mount_setattr` | `EPERM` | C29: mounts, old and new API |
//! | `io_uring_setup`, `io_uring_enter`, `io_uring_register` | `EPERM` | C31: large kernel surface; its operations bypass seccomp |
//! | `keyctl`, `add_key`, `request_key` | `EPERM` | C31: the keyring is not namespaced |
//! | `bpf`, `perf_event_open`, `userfaultfd` | `EPERM` | C31: kernel-exploit primitives |
//! | `kexec_load`, `kexec_file_load`, `init_module`, `finit_module`, `delete_module` | `EPERM` | C31: kernel replacement and modules |
//! | `open_by_handle_at`, `name_to_handle_at` | `EPERM` | C31: the "shocker" escape; nothing a tool runs needs file handles |
//! | `socket` with domain `AF_ALG`, `AF_VSOCK`, `AF_PACKET` | `EPERM` | C32: kernel crypto API (a recurring exploit surface), host vsock, raw link-layer. `AF_NETLINK` stays: `ip` needs it |
//! | `ptrace`, `process_vm_readv`, `process_vm_writev`, `pidfd_getfd`, `kcmp` | `EPERM` | C34: reading or steering another process of the unit (the executor) |
//! | `ioctl` `TIOCSTI`, `TIOCLINUX` (low 32 bits, so the high-bit variant too) | `EPERM` | C41: typing into a terminal |
//! | `personality` other than `PER_LINUX`, `PER_LINUX32`, `UNAME26`, both, or the query `0xffffffff` | `EPERM` | Docker's default set; `ADDR_NO_RANDOMIZE`, `READ_IMPLIES_EXEC` weaken exploit mitigations |
//!
//! Everything else is allowed here (the engine's allowlist, where there is
//! one, still applies underneath).

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch, sock_filter,
};
use serde::Serialize;

/// When a rule matches a call of its syscall.
#[derive(Debug, Clone, Copy)]
enum When {
    /// Every call.
    Always,
    /// The argument's low 32 bits equal the value.
    ArgIs(u8, u64),
    /// The argument's low 32 bits have any of these bits set.
    ArgHasAnyBit(u8, &'static [u64]),
    /// The argument's low 32 bits are none of these values.
    ArgIsNone(u8, &'static [u64]),
}

/// One row of the deny table: a syscall, when it is denied, and why.
#[derive(Debug, Clone, Copy)]
struct Rule {
    name: &'static str,
    nr: i64,
    when: When,
    why: &'static str,
}

const fn rule(name: &'static str, nr: i64, when: When, why: &'static str) -> Rule {
    Rule {
        name,
        nr,
        when,
        why,
    }
}

// Flags and values the libc crate does not define for x86_64 glibc.
const CLONE_NEWTIME: u64 = 0x80;
const PER_LINUX: u64 = 0x0000;
const PER_LINUX32: u64 = 0x0008;
const UNAME26: u64 = 0x0002_0000;
const PERSONALITY_QUERY: u64 = 0xffff_ffff;
/// Syscall numbers with this bit set are the x32 ABI's.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;
const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;
/// Offsets in `struct seccomp_data`.
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;

/// The namespace flags of `clone` (`CLONE_NEWTIME` is not one there: 0x80 is
/// part of the exit signal in `clone`'s flags).
const CLONE_NAMESPACES: &[u64] = &[
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWCGROUP as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
];
/// The namespace flags of `unshare`.
const UNSHARE_NAMESPACES: &[u64] = &[
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWCGROUP as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    CLONE_NEWTIME,
];
const PERSONALITIES: &[u64] = &[
    PER_LINUX,
    PER_LINUX32,
    UNAME26,
    UNAME26 | PER_LINUX32,
    PERSONALITY_QUERY,
];

const NAMESPACES: &str = "C28: new namespaces";
const MOUNTS: &str = "C29: mounts";
const KERNEL: &str = "C31: kernel attack surface";
const SOCKETS: &str = "C32: socket family";
const PTRACE: &str = "C34: access to another process of the unit";
const TERMINAL: &str = "C41: terminal injection";
const PERSONA: &str = "personality: ADDR_NO_RANDOMIZE and READ_IMPLIES_EXEC weaken mitigations";
const ALWAYS: When = When::Always;

/// The deny table (the module doc renders it with reasons).
#[rustfmt::skip] // A table: one row a line.
const RULES: &[Rule] = &[
    rule("clone", libc::SYS_clone, When::ArgHasAnyBit(0, CLONE_NAMESPACES), NAMESPACES),
    rule("unshare", libc::SYS_unshare, When::ArgHasAnyBit(0, UNSHARE_NAMESPACES), NAMESPACES),
    rule("setns", libc::SYS_setns, ALWAYS, NAMESPACES),
    rule("mount", libc::SYS_mount, ALWAYS, MOUNTS),
    rule("umount2", libc::SYS_umount2, ALWAYS, MOUNTS),
    rule("pivot_root", libc::SYS_pivot_root, ALWAYS, MOUNTS),
    rule("fsopen", libc::SYS_fsopen, ALWAYS, MOUNTS),
    rule("fsconfig", libc::SYS_fsconfig, ALWAYS, MOUNTS),
    rule("fsmount", libc::SYS_fsmount, ALWAYS, MOUNTS),
    rule("fspick", libc::SYS_fspick, ALWAYS, MOUNTS),
    rule("move_mount", libc::SYS_move_mount, ALWAYS, MOUNTS),
    rule("open_tree", libc::SYS_open_tree, ALWAYS, MOUNTS),
    rule("mount_setattr", libc::SYS_mount_setattr, ALWAYS, MOUNTS),
    rule("io_uring_setup", libc::SYS_io_uring_setup, ALWAYS, KERNEL),
    rule("io_uring_enter", libc::SYS_io_uring_enter, ALWAYS, KERNEL),
    rule("io_uring_register", libc::SYS_io_uring_register, ALWAYS, KERNEL),
    rule("keyctl", libc::SYS_keyctl, ALWAYS, KERNEL),
    rule("add_key", libc::SYS_add_key, ALWAYS, KERNEL),
    rule("request_key", libc::SYS_request_key, ALWAYS, KERNEL),
    rule("bpf", libc::SYS_bpf, ALWAYS, KERNEL),
    rule("perf_event_open", libc::SYS_perf_event_open, ALWAYS, KERNEL),
    rule("userfaultfd", libc::SYS_userfaultfd, ALWAYS, KERNEL),
    rule("kexec_load", libc::SYS_kexec_load, ALWAYS, KERNEL),
    rule("kexec_file_load", libc::SYS_kexec_file_load, ALWAYS, KERNEL),
    rule("init_module", libc::SYS_init_module, ALWAYS, KERNEL),
    rule("finit_module", libc::SYS_finit_module, ALWAYS, KERNEL),
    rule("delete_module", libc::SYS_delete_module, ALWAYS, KERNEL),
    rule("open_by_handle_at", libc::SYS_open_by_handle_at, ALWAYS, KERNEL),
    rule("name_to_handle_at", libc::SYS_name_to_handle_at, ALWAYS, KERNEL),
    rule("socket", libc::SYS_socket, When::ArgIs(0, libc::AF_ALG as u64), SOCKETS),
    rule("socket", libc::SYS_socket, When::ArgIs(0, libc::AF_VSOCK as u64), SOCKETS),
    rule("socket", libc::SYS_socket, When::ArgIs(0, libc::AF_PACKET as u64), SOCKETS),
    rule("ptrace", libc::SYS_ptrace, ALWAYS, PTRACE),
    rule("process_vm_readv", libc::SYS_process_vm_readv, ALWAYS, PTRACE),
    rule("process_vm_writev", libc::SYS_process_vm_writev, ALWAYS, PTRACE),
    rule("pidfd_getfd", libc::SYS_pidfd_getfd, ALWAYS, PTRACE),
    rule("kcmp", libc::SYS_kcmp, ALWAYS, PTRACE),
    rule("ioctl", libc::SYS_ioctl, When::ArgIs(1, libc::TIOCSTI), TERMINAL),
    rule("ioctl", libc::SYS_ioctl, When::ArgIs(1, libc::TIOCLINUX), TERMINAL),
    rule("personality", libc::SYS_personality, When::ArgIsNone(0, PERSONALITIES), PERSONA),
];

/// What [`install_box_filter`] applied, read back from the kernel where it can.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SeccompReport {
    /// Rows of the deny table.
    pub rules: usize,
    /// Instructions in the installed program.
    pub instructions: usize,
    /// `Seccomp:` of `/proc/self/status` after installing (2 = filter).
    pub mode: Option<u32>,
    /// `Seccomp_filters:` after installing (the engine's plus ours; kernel ≥ 5.9).
    pub filters: Option<u32>,
    /// Whether the process is still dumpable (false once hardened).
    pub dumpable: bool,
}

fn condition(
    rule: &Rule,
    arg: u8,
    op: SeccompCmpOp,
    value: u64,
) -> Result<SeccompCondition, String> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value)
        .map_err(|error| format!("seccomp rule {} ({}): {error}", rule.name, rule.why))
}

fn seccomp_rule(rule: &Rule, conditions: Vec<SeccompCondition>) -> Result<SeccompRule, String> {
    SeccompRule::new(conditions)
        .map_err(|error| format!("seccomp rule {} ({}): {error}", rule.name, rule.why))
}

/// The seccompiler rules of one table row (empty: every call).
fn rules_of(rule: &Rule) -> Result<Vec<SeccompRule>, String> {
    match rule.when {
        When::Always => Ok(Vec::new()),
        When::ArgIs(arg, value) => Ok(vec![seccomp_rule(
            rule,
            vec![condition(rule, arg, SeccompCmpOp::Eq, value)?],
        )?]),
        // Conditions of one rule are ANDed and rules ORed: one rule per bit.
        When::ArgHasAnyBit(arg, bits) => bits
            .iter()
            .map(|&bit| {
                seccomp_rule(
                    rule,
                    vec![condition(rule, arg, SeccompCmpOp::MaskedEq(bit), bit)?],
                )
            })
            .collect(),
        When::ArgIsNone(arg, values) => {
            let conditions = values
                .iter()
                .map(|&value| condition(rule, arg, SeccompCmpOp::Ne, value))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(vec![seccomp_rule(rule, conditions)?])
        }
    }
}

fn statement(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

// Classic BPF opcodes (linux/bpf_common.h); seccompiler keeps its own private.
const BPF_LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
const BPF_JEQ_K: u16 = 0x05 | 0x10;
const BPF_JGE_K: u16 = 0x05 | 0x30;
const BPF_RET_K: u16 = 0x06;

/// What runs before seccompiler's program: the foreign-arch kill, the x32
/// answer and `clone3`'s `ENOSYS`, which need answers other than its one
/// match action.
fn prologue() -> Vec<sock_filter> {
    let errno = |errno: i32| libc::SECCOMP_RET_ERRNO | (errno as u32 & libc::SECCOMP_RET_DATA);
    vec![
        statement(BPF_LD_W_ABS, DATA_ARCH),
        jump(BPF_JEQ_K, AUDIT_ARCH_X86_64, 1, 0),
        statement(BPF_RET_K, libc::SECCOMP_RET_KILL_PROCESS),
        statement(BPF_LD_W_ABS, DATA_NR),
        jump(BPF_JGE_K, X32_SYSCALL_BIT, 0, 1),
        statement(BPF_RET_K, errno(libc::ENOSYS)),
        jump(BPF_JEQ_K, libc::SYS_clone3 as u32, 0, 1),
        statement(BPF_RET_K, errno(libc::ENOSYS)),
    ]
}

/// Box's seccomp program for x86_64 (see the module doc for every rule).
/// Pure: builds, installs nothing.
pub fn box_filter() -> Result<BpfProgram, String> {
    compile(RULES)
}

/// The prologue, then `rules` compiled by seccompiler (match: `EPERM`).
fn compile(rules: &[Rule]) -> Result<BpfProgram, String> {
    let mut by_syscall: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    let mut always: BTreeMap<i64, &'static str> = BTreeMap::new();
    for rule in rules {
        let rules = rules_of(rule)?;
        // An empty list means "every call" to seccompiler: it cannot be mixed
        // with conditional rows of the same syscall.
        let conflict = if rules.is_empty() {
            by_syscall.contains_key(&rule.nr)
        } else {
            always.contains_key(&rule.nr)
        };
        if conflict {
            return Err(format!(
                "seccomp rule {}: an unconditional row cannot share a syscall with conditional ones",
                rule.name
            ));
        }
        if rules.is_empty() {
            always.insert(rule.nr, rule.name);
        }
        by_syscall.entry(rule.nr).or_default().extend(rules);
    }
    let filter = SeccompFilter::new(
        by_syscall,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        TargetArch::x86_64,
    )
    .map_err(|error| format!("seccomp filter: {error}"))?;
    let program: BpfProgram = filter
        .try_into()
        .map_err(|error| format!("seccomp filter: {error}"))?;
    let mut full = prologue();
    full.extend(program);
    Ok(full)
}

/// Harden the calling process: no_new_privs, box's seccomp filter on every
/// thread (TSYNC), then non-dumpable. Call it once, before serving; the
/// filter cannot be removed and children inherit it.
pub fn install_box_filter() -> Result<SeccompReport, String> {
    let program = box_filter()?;
    use nix::sys::prctl;
    // Setting it again is harmless, and seccomp requires it without CAP_SYS_ADMIN.
    prctl::set_no_new_privs().map_err(|errno| {
        format!(
            "seccomp: setting no_new_privs: {}",
            std::io::Error::from(errno)
        )
    })?;
    seccompiler::apply_filter_all_threads(&program)
        .map_err(|error| format!("seccomp: installing the box filter on every thread: {error}"))?;
    prctl::set_dumpable(false)
        .map_err(|errno| format!("PR_SET_DUMPABLE=0: {}", std::io::Error::from(errno)))?;
    // An error reads as dumpable, as the raw call's -1 did.
    let dumpable = prctl::get_dumpable().unwrap_or(true);
    if dumpable {
        return Err("PR_SET_DUMPABLE=0: the process is still dumpable".to_owned());
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
    };
    Ok(SeccompReport {
        rules: RULES.len(),
        instructions: program.len(),
        mode: field("Seccomp:"),
        filters: field("Seccomp_filters:"),
        dumpable,
    })
}

#[cfg(test)]
mod tests;
