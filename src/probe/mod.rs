pub mod plan;
pub mod scenario;
