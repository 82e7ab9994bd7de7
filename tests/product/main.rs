//! The product as a whole, one binary: what spans the binaries and the repository (the
//! conf examples through every plugin and cnitool, the operator tools' shared conventions,
//! the demo scripts, the packages' file lists and units, a fresh machine) and the crate graph
//! of the workspace against docs/design.md.

mod cli_convention;
mod conf_examples;
mod conf_examples_e2e;
mod crate_graph;
mod demo;
mod design_names;
mod e2e_cnitool;
mod file_circles;
mod fresh_machine;
mod packaging_manifest;
mod packaging_units;
