//! `kb-sim`: the simulator's command line with the built-in workloads.

fn main() -> std::process::ExitCode {
    kb_sim::cli::main(kb_workloads::all())
}
