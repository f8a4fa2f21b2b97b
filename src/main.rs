//! The `box` command line: parse, dispatch into the library, report
//! (`boxhost::cli`).

fn main() -> std::process::ExitCode {
    boxhost::cli::main()
}
