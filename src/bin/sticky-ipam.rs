//! The sticky-ipam CNI plugin, and its operator's tool when run without `CNI_COMMAND`.
//! See the crate README and docs/operations.md.

fn main() -> std::process::ExitCode {
    if std::env::var_os("CNI_COMMAND").is_some() {
        sticky_cni::cni::skel::run("sticky-ipam", &sticky_cni::ipam::plugin::IpamPlugin)
    } else {
        sticky_cni::cli::ipam::main(std::env::args().skip(1).collect())
    }
}
