//! The wall clock as the operator reads it: one place, so the modules that stamp times
//! (conditions, pod ages, leases) import a leaf instead of the crate root.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// The wall clock as a Kubernetes time (condition transitions, pod ages).
pub(crate) fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}
