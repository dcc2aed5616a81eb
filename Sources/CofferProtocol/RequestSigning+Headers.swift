extension RequestSigning {
    /// Whether a request's timestamp is positive and within `API.maxClockSkewMillis` of `now`: the
    /// server's check, kept here so that the fuzzer runs this very function.
    ///
    /// The distance is computed without a trap for any pair of values: `abs(now - ts)` overflows
    /// (and `abs(Int64.min)` traps) for a timestamp near `Int64.min + now`, which any caller can send
    /// before a signature is checked. Fuzzed by `CofferFuzz` (target `request-headers`).
    public static func isFresh(timestamp: Int64, now: Int64) -> Bool {
        guard timestamp > 0, now > 0 else { return false }
        let (distance, overflow) = now.subtractingReportingOverflow(timestamp)
        return !overflow && distance.magnitude <= API.maxClockSkewMillis.magnitude
    }
}
