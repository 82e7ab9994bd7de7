//! `sticky-wg IFNAME`: the sites gateway's WireGuard data path. See the library's docs and
//! docs/sites.md ("The data-path daemon sticky-wg").

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    sticky_wg::main(&args)
}
