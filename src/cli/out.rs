//! Commands' standard output. `println!` panics when the reader has gone
//! (`box units ls | head -1`); every command writes through `outln!`/`out!`
//! instead, which end the process quietly with 0 on a closed pipe, as
//! ripgrep and other Unix tools do. A tidy test keeps `println!` out of
//! `src/cli/`. The listings' tables (`box units ls`, `box units top`, `box
//! volumes ls`) are laid out here too (`columns`).

use std::io::Write as _;

/// Write `args` to standard output and flush. A closed pipe exits 0 at once,
/// with nothing on stderr; any other write error exits 1 naming it.
pub fn write_fmt(args: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    if let Err(error) = out.write_fmt(args).and_then(|()| out.flush()) {
        closed(&error);
    }
}

/// Write `bytes` to standard output, as `write_fmt` does.
pub fn write_bytes(bytes: &[u8]) {
    let mut out = std::io::stdout().lock();
    if let Err(error) = out.write_all(bytes).and_then(|()| out.flush()) {
        closed(&error);
    }
}

/// Standard output failed: nothing more can be said there, so the command
/// ends here rather than computing output nobody reads.
fn closed(error: &std::io::Error) -> ! {
    if error.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
    // Writing to stderr may fail as well; there is nowhere left to say it.
    let _ = writeln!(
        std::io::stderr(),
        "box: cannot write to standard output: {error}"
    );
    std::process::exit(1);
}

/// `lines` (the header first) as a table: each column as wide as its widest
/// cell, three spaces apart, no line ending in spaces.
pub fn columns<Line: AsRef<[String]>>(lines: &[Line]) -> String {
    let mut widths: Vec<usize> = Vec::new();
    for line in lines {
        for (column, cell) in line.as_ref().iter().enumerate() {
            let width = cell.chars().count();
            match widths.get_mut(column) {
                Some(widest) => *widest = (*widest).max(width),
                None => widths.push(width),
            }
        }
    }
    let mut out = String::new();
    for line in lines {
        let line = line.as_ref();
        let mut text = String::new();
        for (column, cell) in line.iter().enumerate() {
            text.push_str(cell);
            if column + 1 < line.len() {
                let pad = widths[column] - cell.chars().count() + 3;
                text.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    }
    out
}

/// `text` with each control character escaped (`\n`, `\u{1b}`): nothing
/// in a cell may move the cursor or break the line.
pub fn escape_controls(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect()
}

/// `println!` that ends the command quietly on a closed pipe.
macro_rules! outln {
    () => {
        $crate::cli::out::write_fmt(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::cli::out::write_fmt(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` that ends the command quietly on a closed pipe.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::cli::out::write_fmt(format_args!($($arg)*))
    };
}
