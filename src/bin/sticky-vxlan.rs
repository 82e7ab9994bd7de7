//! `sticky-vxlan`: a CNI plugin when `CNI_COMMAND` is set, else the operator's tool.

use std::os::unix::process::CommandExt;
use std::process::ExitCode;

use sticky_cni::cli::vxlan;
use sticky_cni::networks::StickyVxlan;

fn main() -> ExitCode {
    if std::env::var_os("CNI_COMMAND").is_some() {
        return sticky_cni::cni::skel::run(&StickyVxlan);
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("agent") {
        return agent_alias(&args[1..]);
    }
    vxlan::main(args)
}

/// `sticky-vxlan agent ...`, kept for one release: runs `sticky-vxlan-agent` from this binary's
/// directory (or `$PATH`) with the same arguments, and says so.
fn agent_alias(args: &[String]) -> ExitCode {
    const AGENT: &str = "sticky-vxlan-agent";
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join(AGENT)))
        .filter(|p| p.is_file());
    let program = beside.map_or_else(|| AGENT.into(), std::path::PathBuf::into_os_string);
    eprintln!(
        "sticky-vxlan: `sticky-vxlan agent` is deprecated and will be removed in the next release: running {} (the agent is a program of its own now)",
        std::path::Path::new(&program).display()
    );
    let err = std::process::Command::new(&program).args(args).exec();
    eprintln!(
        "sticky-vxlan: cannot run {}: {err} (install sticky-vxlan-agent beside sticky-vxlan or on $PATH)",
        std::path::Path::new(&program).display()
    );
    ExitCode::FAILURE
}
