import Foundation

/// What a FUSE request does not carry about its caller: supplementary groups and capabilities.
/// Both are read from the caller's `/proc/<tid>/status` while it waits for the reply (as
/// libfuse's `fuse_req_getgroups` does for groups), and only where the setuid/setgid rule needs
/// them. When that cannot be read (a caller in another pid namespace has pid 0) the answers are
/// no, which for that rule errs towards dropping a bit.
extension RequestContext {
    /// CAP_FSETID: keeps setuid and setgid through writes, truncates and chowns.
    public static let capabilityFSetID = 4
    /// CAP_FOWNER: acts as the owner of any file (here: may change its mode).
    public static let capabilityFOwner = 3

    /// Whether the caller belongs to group `gid`: its filesystem gid, or a supplementary group.
    public func isInGroup(_ gid: UInt32) -> Bool {
        if gid == self.gid { return true }
        guard pid > 0 else { return false }
        return Self.supplementaryGroups(ofTask: pid)?.contains(gid) ?? false
    }

    /// Whether the caller holds `capability` in its effective set.
    public func hasCapability(_ capability: Int) -> Bool {
        guard pid > 0, capability >= 0, capability < 64,
              let field = Self.statusField("CapEff:", ofTask: pid), let set = UInt64(field, radix: 16) else { return false }
        return set & (1 << UInt64(capability)) != 0
    }

    /// Whether the caller may keep a file's setgid bit where the VFS asks
    /// (`in_group_or_capable`): it is in the file's group, or holds CAP_FSETID.
    public func mayKeepSetGID(ofGroup gid: UInt32) -> Bool {
        isInGroup(gid) || hasCapability(Self.capabilityFSetID)
    }

    /// The "Groups:" line of `/proc/<tid>/status`, or nil if it cannot be read.
    public static func supplementaryGroups(ofTask tid: Int32) -> [UInt32]? {
        statusField("Groups:", ofTask: tid).map { $0.split(separator: " ").compactMap { UInt32($0) } }
    }

    /// The value of one line of `/proc/<tid>/status`, blanks trimmed, or nil.
    static func statusField(_ name: String, ofTask tid: Int32) -> String? {
        guard let status = try? String(contentsOfFile: "/proc/\(tid)/status", encoding: .utf8) else { return nil }
        for line in status.split(separator: "\n") where line.hasPrefix(name) {
            return line.dropFirst(name.count).split(whereSeparator: { $0 == " " || $0 == "\t" }).joined(separator: " ")
        }
        return nil
    }
}
