import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// The kernel's page cache as tests see it, for checking that a prefetch brought a file's pages
/// in from disk. Every call throws when it cannot look, so a check never passes on a file it did
/// not see.
public enum PageCache {
    public struct Failure: Error, CustomStringConvertible {
        public let description: String
    }

    /// Which of a file's pages are in the page cache (`mincore` over a mapping).
    public static func residentPages(_ path: String) throws -> [Bool] {
        let fd = open(path, O_RDONLY)
        guard fd >= 0 else { throw Failure(description: "cannot open \(path): errno \(errno)") }
        defer { close(fd) }
        var st = stat()
        guard fstat(fd, &st) == 0 else { throw Failure(description: "cannot stat \(path): errno \(errno)") }
        guard st.st_size > 0 else { throw Failure(description: "\(path) is empty") }
        let size = Int(st.st_size)
        guard let map = mmap(nil, size, PROT_READ, MAP_SHARED, fd, 0), map != MAP_FAILED else {
            throw Failure(description: "cannot map \(path): errno \(errno)")
        }
        defer { munmap(map, size) }
        var vec = [UInt8](repeating: 0, count: (size + pageSize - 1) / pageSize)
        guard mincore(map, size, &vec) == 0 else { throw Failure(description: "mincore of \(path): errno \(errno)") }
        return vec.map { $0 & 1 == 1 }
    }

    /// Syncs the file and drops its pages from the page cache (clean pages go), as after a
    /// reboot. Returns how many pages stayed.
    @discardableResult
    public static func evict(_ path: String) throws -> Int {
        let fd = open(path, O_RDONLY)
        guard fd >= 0 else { throw Failure(description: "cannot open \(path): errno \(errno)") }
        _ = fsync(fd)
        let advice = posix_fadvise(fd, 0, 0, Int32(POSIX_FADV_DONTNEED))
        close(fd)
        guard advice == 0 else { throw Failure(description: "posix_fadvise of \(path): error \(advice)") }
        return try residentPages(path).filter { $0 }.count
    }

    /// Waits up to `seconds` for every page of `range` (page indices, at least one, all inside
    /// the file) to be resident; whether they all were.
    public static func waitUntilResident(_ path: String, pages range: Range<Int>, seconds: Double = 2) throws -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while true {
            let resident = try residentPages(path)
            guard !range.isEmpty, range.lowerBound >= 0, range.upperBound <= resident.count else {
                throw Failure(description: "pages \(range) of \(path), which has \(resident.count)")
            }
            if range.allSatisfy({ resident[$0] }) { return true }
            if Date() > deadline { return false }
            usleep(10_000)
        }
    }

    public static let pageSize = Int(sysconf(Int32(_SC_PAGESIZE)))
}
