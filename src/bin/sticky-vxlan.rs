//! `sticky-vxlan`: a CNI plugin when `CNI_COMMAND` is set, else the operator's tool.

use std::process::ExitCode;

use sticky_cni::segment::mode::ByMode;
use sticky_cni::vxlan::cli;

fn main() -> ExitCode {
    if std::env::var_os("CNI_COMMAND").is_some() {
        return sticky_cni::cni::skel::run(&ByMode);
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("agent") {
        return sticky_cni::agent::main(&args[1..]);
    }
    cli::main(args)
}
