//! `sticky-vxlan`: a CNI plugin when `CNI_COMMAND` is set, else the operator's tool.

use std::process::ExitCode;

use sticky_cni::cli::vxlan;
use sticky_cni::networks::StickyVxlan;

fn main() -> ExitCode {
    if std::env::var_os("CNI_COMMAND").is_some() {
        return sticky_cni::cni::skel::run("sticky-vxlan", &StickyVxlan);
    }
    vxlan::main(std::env::args().skip(1).collect())
}
