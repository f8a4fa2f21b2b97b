//! A unit's resource usage ([`UnitStats`]), read from its cgroup's own files
//! (v2, or v1's controllers) or, where a unit has no cgroup of its own (a
//! local unit), summed over its process tree in `/proc`.
//!
//! The parsers are pure (a file's text in, a figure out) so they are tested
//! over sample texts; [`Cgroup::read`] and [`process_tree`] do the reading.
//! A figure a source does not give is `None` (unknown), never 0.

use std::path::{Path, PathBuf};

use serde::Serialize;

/// What a unit uses now, as its backend could read it; `None` is unknown.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UnitStats {
    /// CPU time its processes used, user and system, in microseconds.
    pub cpu_usec: Option<u64>,
    /// Memory it is charged for now, in bytes.
    pub memory_bytes: Option<u64>,
    /// The most memory it was charged for at once, in bytes.
    pub memory_peak_bytes: Option<u64>,
    /// Its tasks (processes and threads) now.
    pub pids: Option<u64>,
    /// Bytes it read from block devices.
    pub io_read_bytes: Option<u64>,
    /// Bytes it wrote to block devices.
    pub io_write_bytes: Option<u64>,
    /// Processes the kernel's OOM killer killed in it (its memory cgroup's
    /// `oom_kill`).
    pub oom_kills: Option<u64>,
    /// The last process the OOM killer killed in it, as the kernel's log
    /// names it (`None`: none, or the log cannot be read here).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oom_killed: Option<OomKill>,
}

/// A process the OOM killer killed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OomKill {
    /// Its pid, in the host's pid namespace.
    pub pid: u32,
    /// Its command name (the kernel's `comm`, at most 15 bytes).
    pub process: String,
}

/// Where a unit's cgroup is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cgroup {
    /// cgroup v2: one directory holding every controller's files.
    V2(PathBuf),
    /// cgroup v1: the mount root (`/sys/fs/cgroup`) and the unit's path
    /// relative to each controller's hierarchy (`docker/ID`).
    V1 {
        /// Where the controllers are mounted.
        root: PathBuf,
        /// The unit's path beneath each controller.
        relative: PathBuf,
    },
}

impl Cgroup {
    /// The cgroup of the path `relative` (as `/proc/PID/cgroup` or an engine
    /// names it) under `root`, on whichever version `root` mounts: `None`
    /// when its memory files are not there (another host's, or gone).
    pub fn find(root: &Path, relative: &str) -> Option<Cgroup> {
        let relative = relative.trim_start_matches('/');
        if root.join("cgroup.controllers").exists() {
            let dir = root.join(relative);
            dir.join("memory.current")
                .is_file()
                .then_some(Cgroup::V2(dir))
        } else {
            root.join("memory")
                .join(relative)
                .join("memory.usage_in_bytes")
                .is_file()
                .then(|| Cgroup::V1 {
                    root: root.to_path_buf(),
                    relative: PathBuf::from(relative),
                })
        }
    }

    /// Read the unit's usage from its cgroup's files; a file that cannot be
    /// read leaves its figure unknown.
    pub fn read(&self) -> UnitStats {
        match self {
            Cgroup::V2(dir) => {
                let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
                let (io_read_bytes, io_write_bytes) = read("io.stat")
                    .map(|text| io_stat_v2(&text))
                    .map_or((None, None), |(r, w)| (Some(r), Some(w)));
                UnitStats {
                    cpu_usec: read("cpu.stat").and_then(|text| cpu_stat_v2(&text)),
                    memory_bytes: read("memory.current").and_then(|text| single(&text)),
                    memory_peak_bytes: read("memory.peak").and_then(|text| single(&text)),
                    pids: read("pids.current").and_then(|text| single(&text)),
                    io_read_bytes,
                    io_write_bytes,
                    oom_kills: read("memory.events").and_then(|text| keyed(&text, "oom_kill")),
                    oom_killed: None,
                }
            }
            Cgroup::V1 { root, relative } => {
                let read = |controller: &str, name: &str| {
                    std::fs::read_to_string(root.join(controller).join(relative).join(name)).ok()
                };
                let (io_read_bytes, io_write_bytes) =
                    read("blkio", "blkio.throttle.io_service_bytes")
                        .map(|text| blkio_v1(&text))
                        .map_or((None, None), |(r, w)| (Some(r), Some(w)));
                UnitStats {
                    // cpuacct.usage is in nanoseconds.
                    cpu_usec: read("cpuacct", "cpuacct.usage")
                        .and_then(|text| single(&text))
                        .map(|ns| ns / 1000),
                    memory_bytes: read("memory", "memory.usage_in_bytes")
                        .and_then(|text| single(&text)),
                    memory_peak_bytes: read("memory", "memory.max_usage_in_bytes")
                        .and_then(|text| single(&text)),
                    pids: read("pids", "pids.current").and_then(|text| single(&text)),
                    io_read_bytes,
                    io_write_bytes,
                    // Kernels since 4.13 count kills in `memory.oom_control`.
                    oom_kills: read("memory", "memory.oom_control")
                        .and_then(|text| keyed(&text, "oom_kill")),
                    oom_killed: None,
                }
            }
        }
    }
}

impl Cgroup {
    /// A process in the cgroup (the first its `cgroup.procs` lists): one
    /// that sees the unit's mounts.
    pub fn a_process(&self) -> Option<u32> {
        let procs = match self {
            Cgroup::V2(dir) => dir.join("cgroup.procs"),
            Cgroup::V1 { root, relative } => {
                root.join("memory").join(relative).join("cgroup.procs")
            }
        };
        std::fs::read_to_string(procs)
            .ok()?
            .lines()
            .find_map(|line| line.trim().parse().ok())
    }
}

/// A file holding one number (`memory.current`, `pids.current`, ...).
pub fn single(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// `usage_usec` of a v2 `cpu.stat`.
pub fn cpu_stat_v2(text: &str) -> Option<u64> {
    keyed(text, "usage_usec")
}

/// The value of `key` in a flat keyed file (`key value` lines).
fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (name, value) = line.split_once(' ')?;
        (name == key).then(|| value.trim().parse().ok()).flatten()
    })
}

/// Bytes read and written, summed over the devices of a v2 `io.stat`
/// (`MAJ:MIN rbytes=N wbytes=N rios=N ...` lines).
pub fn io_stat_v2(text: &str) -> (u64, u64) {
    let (mut read, mut written) = (0u64, 0u64);
    for field in text
        .lines()
        .flat_map(|line| line.split_whitespace().skip(1))
    {
        let Some((key, value)) = field.split_once('=') else {
            continue;
        };
        let Ok(value) = value.parse::<u64>() else {
            continue;
        };
        match key {
            "rbytes" => read = read.saturating_add(value),
            "wbytes" => written = written.saturating_add(value),
            _ => {}
        }
    }
    (read, written)
}

/// Bytes read and written, summed over the devices of a v1
/// `blkio.throttle.io_service_bytes` (`MAJ:MIN Read N` lines, and a
/// `Total N` line that is left out).
pub fn blkio_v1(text: &str) -> (u64, u64) {
    let (mut read, mut written) = (0u64, 0u64);
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        let (Some(_device), Some(op), Some(value)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let Ok(value) = value.parse::<u64>() else {
            continue;
        };
        match op {
            "Read" => read = read.saturating_add(value),
            "Write" => written = written.saturating_add(value),
            _ => {}
        }
    }
    (read, written)
}

/// One process as `/proc/PID/stat` shows it: its parent, and its CPU time
/// with its reaped children's, in clock ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// Its parent's pid.
    pub ppid: u32,
    /// utime + stime + cutime + cstime.
    pub ticks: u64,
    /// Its threads.
    pub threads: u64,
}

/// Parse `/proc/PID/stat`; the command name (field 2) may hold spaces and
/// parentheses, so the fields are counted from its last `)`.
pub fn proc_stat(text: &str) -> Option<ProcStat> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(3) ppid(4) ... utime(14) stime(15) cutime(16)
    // cstime(17) ... num_threads(20); index = field number - 3.
    let field = |n: usize| {
        fields
            .get(n - 3)
            .and_then(|value| value.parse::<i64>().ok())
    };
    let ticks = [14, 15, 16, 17]
        .into_iter()
        .map(|n| field(n).map(|t| t.max(0).unsigned_abs()))
        .sum::<Option<u64>>()?;
    Some(ProcStat {
        ppid: u32::try_from(field(4)?).ok()?,
        ticks,
        threads: field(20)?.max(0).unsigned_abs(),
    })
}

/// `read_bytes` and `write_bytes` of `/proc/PID/io` (what reached the
/// block layer, as the cgroup counts).
pub fn proc_io(text: &str) -> Option<(u64, u64)> {
    Some((
        keyed_colon(text, "read_bytes")?,
        keyed_colon(text, "write_bytes")?,
    ))
}

/// `VmRSS` of `/proc/PID/status`, in bytes.
pub fn proc_rss(text: &str) -> Option<u64> {
    let line = text.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The value of `key` in a `key: value` file.
fn keyed_colon(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        (name == key).then(|| value.trim().parse().ok()).flatten()
    })
}

/// The usage of the process tree rooted at `pid`, summed over `/proc`: what
/// a unit with no cgroup of its own can report. CPU time counts the live
/// processes' own and their reaped children's; memory is the sum of their
/// resident sets (shared pages counted in each); its peak is unknown;
/// block IO counts what each process (and its reaped children) did, where
/// `/proc/PID/io` may be read. `None` when `pid` is gone.
pub fn process_tree(proc_root: &Path, pid: u32) -> Option<UnitStats> {
    let procs = processes(proc_root)?;
    let tree = descendants(&procs, pid)?;
    let tick = clock_ticks();
    let mut stats = UnitStats {
        cpu_usec: Some(0),
        memory_bytes: Some(0),
        pids: Some(0),
        io_read_bytes: Some(0),
        io_write_bytes: Some(0),
        ..UnitStats::default()
    };
    let add = |figure: &mut Option<u64>, value: Option<u64>| {
        *figure = figure.zip(value).map(|(a, b)| a.saturating_add(b));
    };
    for member in &tree {
        let Some((_, stat)) = procs.iter().find(|(p, _)| p == member) else {
            continue;
        };
        let dir = proc_root.join(member.to_string());
        add(&mut stats.cpu_usec, Some(stat.ticks * 1_000_000 / tick));
        add(&mut stats.pids, Some(stat.threads));
        add(
            &mut stats.memory_bytes,
            std::fs::read_to_string(dir.join("status"))
                .ok()
                .and_then(|text| proc_rss(&text)),
        );
        let io = std::fs::read_to_string(dir.join("io"))
            .ok()
            .and_then(|text| proc_io(&text));
        add(&mut stats.io_read_bytes, io.map(|(r, _)| r));
        add(&mut stats.io_write_bytes, io.map(|(_, w)| w));
    }
    Some(stats)
}

/// The processes the OOM killer killed in a memory cgroup whose path holds
/// `needle` (a container's id), oldest first, from the kernel's log as
/// `/dev/kmsg` gives it (`PRI,SEQ,USEC,FLAGS;MESSAGE` records): its
/// `oom-kill:` summary lines (kernels since 4.19), which name the victim's
/// `task_memcg`, `task` and `pid`.
pub fn oom_kills_in_log(log: &str, needle: &str) -> Vec<OomKill> {
    log.lines()
        .filter_map(|record| {
            let message = record.split_once(';').map_or(record, |(_, m)| m);
            let summary = message.strip_prefix("oom-kill:")?;
            let field = |key: &str| {
                summary
                    .split(',')
                    .find_map(|pair| pair.strip_prefix(key)?.strip_prefix('='))
            };
            if !field("task_memcg")?.contains(needle) {
                return None;
            }
            Some(OomKill {
                pid: field("pid")?.parse().ok()?,
                process: field("task")?.to_owned(),
            })
        })
        .collect()
}

/// The kernel's log as `/dev/kmsg` holds it now, one record a line (the
/// device gives one record a read and `EAGAIN` at the end). Reading it
/// needs root (or `CAP_SYSLOG` where `dmesg_restrict` is set).
pub fn kernel_log() -> std::io::Result<String> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut device = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open("/dev/kmsg")?;
    let mut log = String::new();
    let mut record = vec![0u8; 8192];
    loop {
        match device.read(&mut record) {
            Ok(0) => return Ok(log),
            Ok(length) => {
                log.push_str(&String::from_utf8_lossy(&record[..length]));
                if !log.ends_with('\n') {
                    log.push('\n');
                }
            }
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => return Ok(log),
            // A record overwritten while being read: the next one follows.
            Err(error) if error.raw_os_error() == Some(nix::errno::Errno::EPIPE as i32) => {}
            Err(error) => return Err(error),
        }
    }
}

/// Bytes in use on the filesystem at `path` in the mount namespace of
/// process `pid` (through `/proc/PID/root`, which needs the right to trace
/// it: the same user, or root): a unit's `/tmp` or home tmpfs.
pub fn used_in(proc_root: &Path, pid: u32, path: &Path) -> Option<u64> {
    let inside = proc_root
        .join(pid.to_string())
        .join("root")
        .join(path.strip_prefix("/").unwrap_or(path));
    let stat = nix::sys::statvfs::statvfs(&inside).ok()?;
    let blocks = stat.blocks().saturating_sub(stat.blocks_free());
    Some(blocks.saturating_mul(stat.fragment_size()))
}

/// Every process `/proc` shows, with its `stat`.
fn processes(proc_root: &Path) -> Option<Vec<(u32, ProcStat)>> {
    let mut procs: Vec<(u32, ProcStat)> = Vec::new();
    for entry in std::fs::read_dir(proc_root).ok()?.flatten() {
        let Some(child) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some(stat) = std::fs::read_to_string(entry.path().join("stat"))
            .ok()
            .and_then(|text| proc_stat(&text))
        {
            procs.push((child, stat));
        }
    }
    Some(procs)
}

/// `pid` and its descendants among `procs`, parents first; `None` when
/// `pid` is not there.
fn descendants(procs: &[(u32, ProcStat)], pid: u32) -> Option<Vec<u32>> {
    if !procs.iter().any(|(p, _)| *p == pid) {
        return None;
    }
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        tree.extend(
            procs
                .iter()
                .filter(|(child, stat)| stat.ppid == parent && *child != pid)
                .map(|(child, _)| *child),
        );
        i += 1;
    }
    Some(tree)
}

/// The first of `pid` and its descendants (parents first) in another mount
/// namespace than this process's: one that sees a local unit's own `/tmp`
/// and home (its helper unshares its namespace before it mounts them).
pub fn in_own_mount_namespace(proc_root: &Path, pid: u32) -> Option<u32> {
    let namespace = |pid: &str| std::fs::read_link(proc_root.join(pid).join("ns/mnt")).ok();
    let host = namespace("self")?;
    let procs = processes(proc_root)?;
    descendants(&procs, pid)?
        .into_iter()
        .find(|member| namespace(&member.to_string()).is_some_and(|ns| ns != host))
}

/// Clock ticks per second (`/proc/PID/stat`'s unit).
fn clock_ticks() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .and_then(|ticks| u64::try_from(ticks).ok())
        .filter(|ticks| *ticks > 0)
        .unwrap_or(100)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's summary line names the victim; another cgroup's, a
    /// wrapped continuation and an older kernel's lines name none.
    #[test]
    fn oom_kills_are_read_from_the_kernels_log() {
        let id = "ef59d90764647f74d6a9160c9d80f076b0c8a19f7d53e1f1a0a442d4aee52492";
        let log = format!(
            "4,903,2570031602,-;python3 invoked oom-killer: gfp_mask=0x100cca(GFP_HIGHUSER_MOVABLE), order=0\n\
             6,992,2570032191,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset={id},mems_allowed=0,oom_memcg=/docker/{id},task_memcg=/docker/{id},task=python3,pid=22100,uid=1000\n\
             3,993,2570032254,-;Memory cgroup out of memory: Killed process 22100 (python3) total-vm:37964kB\n\
             6,994,2570032300,-;oom-kill:constraint=CONSTRAINT_MEMCG,oom_memcg=/docker/other,task_memcg=/docker/other,task=node,pid=5,uid=0\n\
             6,995,2570032400,-;oom-kill:constraint=CONSTRAINT_MEMCG,oom_memcg=/system.slice/docker-{id}.scope,task_memcg=/system.slice/docker-{id}.scope,task=cc1 plus,pid=7,uid=0\n"
        );
        assert_eq!(
            oom_kills_in_log(&log, id),
            vec![
                OomKill {
                    pid: 22100,
                    process: "python3".to_owned()
                },
                OomKill {
                    pid: 7,
                    process: "cc1 plus".to_owned()
                },
            ]
        );
        assert!(oom_kills_in_log(&log, "nothing-here").is_empty());
        assert!(oom_kills_in_log("", id).is_empty());
    }

    /// A directory's filesystem is measured through a process's root.
    #[test]
    fn used_bytes_are_read_through_a_processs_root() {
        let me = std::process::id();
        let used = used_in(Path::new("/proc"), me, Path::new("/"));
        assert!(used.is_some_and(|bytes| bytes > 0), "{used:?}");
        assert_eq!(
            used_in(Path::new("/proc"), me, Path::new("/no/such/dir")),
            None
        );
    }

    #[test]
    fn v2_files_are_parsed() {
        let cpu = "usage_usec 1234567\nuser_usec 1000000\nsystem_usec 234567\nnr_periods 0\n";
        assert_eq!(cpu_stat_v2(cpu), Some(1_234_567));
        assert_eq!(cpu_stat_v2("user_usec 5\n"), None);
        assert_eq!(single("67108864\n"), Some(67_108_864));
        assert_eq!(single("max\n"), None);
        let io = "8:0 rbytes=4096 wbytes=8192 rios=1 wios=2 dbytes=0 dios=0\n\
                  259:0 rbytes=100 wbytes=200 rios=1 wios=1 dbytes=0 dios=0\n";
        assert_eq!(io_stat_v2(io), (4196, 8392));
        assert_eq!(io_stat_v2(""), (0, 0));
    }

    #[test]
    fn v1_blkio_sums_devices_without_the_total() {
        let text = "8:0 Read 4096\n8:0 Write 8192\n8:0 Sync 0\n8:0 Async 12288\n8:0 Total 12288\n\
                    8:16 Read 10\n8:16 Write 20\nTotal 12318\n";
        assert_eq!(blkio_v1(text), (4106, 8212));
    }

    #[test]
    fn proc_files_are_parsed() {
        // A name with spaces and a parenthesis.
        let stat = "4242 (py (x) y) S 4000 4242 4242 0 -1 4194304 100 0 0 0 \
                    150 50 7 3 20 0 3 0 12345 1000000 200 18446744073709551615";
        assert_eq!(
            proc_stat(stat),
            Some(ProcStat {
                ppid: 4000,
                ticks: 210,
                threads: 3
            })
        );
        let io = "rchar: 1\nwchar: 2\nsyscr: 3\nsyscw: 4\nread_bytes: 4096\nwrite_bytes: 512\ncancelled_write_bytes: 0\n";
        assert_eq!(proc_io(io), Some((4096, 512)));
        let status = "Name:\tpython3\nVmHWM:\t  70000 kB\nVmRSS:\t   65536 kB\n";
        assert_eq!(proc_rss(status), Some(65536 * 1024));
    }

    #[test]
    fn this_process_tree_is_read_from_proc() {
        let stats = process_tree(Path::new("/proc"), std::process::id()).expect("we are alive");
        assert!(stats.memory_bytes.unwrap_or(0) > 0, "{stats:?}");
        assert!(stats.pids.unwrap_or(0) >= 1, "{stats:?}");
        assert_eq!(stats.memory_peak_bytes, None);
        assert_eq!(process_tree(Path::new("/proc"), u32::MAX), None);
    }

    #[test]
    fn a_cgroup_tree_is_read_from_its_files() {
        let root = tempfile::tempdir().expect("tempdir");
        // v1: one directory per controller.
        for (controller, file, text) in [
            ("memory", "memory.usage_in_bytes", "1000\n"),
            ("memory", "memory.max_usage_in_bytes", "2000\n"),
            ("cpuacct", "cpuacct.usage", "3000000\n"),
            ("pids", "pids.current", "4\n"),
            (
                "blkio",
                "blkio.throttle.io_service_bytes",
                "8:0 Read 5\n8:0 Write 6\nTotal 11\n",
            ),
            (
                "memory",
                "memory.oom_control",
                "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",
            ),
            ("memory", "cgroup.procs", "41\n42\n"),
        ] {
            let dir = root.path().join(controller).join("docker/abc");
            std::fs::create_dir_all(&dir).expect("mkdir");
            std::fs::write(dir.join(file), text).expect("write");
        }
        let cgroup = Cgroup::find(root.path(), "/docker/abc").expect("found");
        assert_eq!(
            cgroup.read(),
            UnitStats {
                cpu_usec: Some(3000),
                memory_bytes: Some(1000),
                memory_peak_bytes: Some(2000),
                pids: Some(4),
                io_read_bytes: Some(5),
                io_write_bytes: Some(6),
                oom_kills: Some(3),
                oom_killed: None,
            }
        );
        assert_eq!(cgroup.a_process(), Some(41));
        assert_eq!(Cgroup::find(root.path(), "docker/gone"), None);
        // v2: one directory; memory.peak absent on older kernels.
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            root.path().join("cgroup.controllers"),
            "memory pids io cpu\n",
        )
        .expect("write");
        let dir = root.path().join("system.slice/docker-abc.scope");
        std::fs::create_dir_all(&dir).expect("mkdir");
        for (file, text) in [
            ("memory.current", "1000\n"),
            ("cpu.stat", "usage_usec 7\n"),
            ("pids.current", "2\n"),
            ("io.stat", "8:0 rbytes=1 wbytes=2 rios=0\n"),
            ("memory.events", "low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n"),
        ] {
            std::fs::write(dir.join(file), text).expect("write");
        }
        let cgroup = Cgroup::find(root.path(), "system.slice/docker-abc.scope").expect("found");
        assert_eq!(
            cgroup.read(),
            UnitStats {
                cpu_usec: Some(7),
                memory_bytes: Some(1000),
                memory_peak_bytes: None,
                pids: Some(2),
                io_read_bytes: Some(1),
                io_write_bytes: Some(2),
                oom_kills: Some(1),
                oom_killed: None,
            }
        );
        assert_eq!(cgroup.a_process(), None);
    }
}
