//! The engine's tests against independent implementations and servers (croniter,
//! moto's S3) and its garbage collection's properties, one test binary.

mod cron_dst;
mod gc;
mod s3;
