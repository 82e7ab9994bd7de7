//! The sticky-ipam CNI plugin. See the crate README.

fn main() -> std::process::ExitCode {
    sticky_cni::cni::skel::run(&sticky_cni::ipam::plugin::IpamPlugin)
}
