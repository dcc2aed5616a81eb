import Foundation

extension RequestContext {
    /// Whether the caller belongs to group `gid`: its filesystem gid, or one of its supplementary
    /// groups. A FUSE request carries only the one gid, so the others are read from the caller's
    /// `/proc/<tid>/status` while it waits for the reply (as libfuse's `fuse_req_getgroups`
    /// does). When that cannot be read (a caller in another pid namespace has pid 0) the answer
    /// is no, which for its one use (`modeDroppingSetIDBits`) errs towards dropping a bit.
    public func isInGroup(_ gid: UInt32) -> Bool {
        if gid == self.gid { return true }
        guard pid > 0 else { return false }
        return Self.supplementaryGroups(ofTask: pid)?.contains(gid) ?? false
    }

    /// The "Groups:" line of `/proc/<tid>/status`, or nil if it cannot be read.
    public static func supplementaryGroups(ofTask tid: Int32) -> [UInt32]? {
        guard let status = try? String(contentsOfFile: "/proc/\(tid)/status", encoding: .utf8) else { return nil }
        for line in status.split(separator: "\n") where line.hasPrefix("Groups:") {
            return line.dropFirst("Groups:".count).split(whereSeparator: { $0 == " " || $0 == "\t" }).compactMap { UInt32($0) }
        }
        return nil
    }
}
