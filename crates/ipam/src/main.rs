//! The sticky-ipam CNI plugin, and its operator's tool when run without `CNI_COMMAND`.
//! See the crate README and docs/operations.md.

fn main() -> std::process::ExitCode {
    if std::env::var_os("CNI_COMMAND").is_some() {
        cni_protocol::skel::run("sticky-ipam", &sticky_ipam::plugin::IpamPlugin)
    } else {
        sticky_ipam::cli::main(std::env::args().skip(1).collect())
    }
}
