//! `kb-sim-example-kernels`: kb-sim's command line with the built-in workloads and
//! this crate's own.

fn main() -> std::process::ExitCode {
    let mut workloads = kb_workloads::all();
    workloads.insert(0, Box::new(my_kernels::AxpyRowMax));
    kb_sim::cli::main(workloads)
}
