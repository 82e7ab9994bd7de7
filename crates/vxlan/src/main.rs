//! `sticky-vxlan`: a CNI plugin when `CNI_COMMAND` is set, else the operator's tool.

use std::process::ExitCode;

use sticky_vxlan::cli;
use sticky_vxlan::networks::StickyVxlan;

fn main() -> ExitCode {
    if std::env::var_os("CNI_COMMAND").is_some() {
        return cni_protocol::skel::run("sticky-vxlan", &StickyVxlan);
    }
    cli::main(std::env::args().skip(1).collect())
}
