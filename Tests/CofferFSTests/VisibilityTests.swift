import CofferTestSupport
import Foundation
import Testing

/// `coffer` commands work while the store is mounted, and a change made either way is visible
/// in the other within a second.
@Suite struct VisibilityTests {
    func names(_ dir: String) -> Set<String> { Set((try? FileManager.default.contentsOfDirectory(atPath: dir)) ?? []) }

    @Test func cliChangesAppearInTheMount() throws {
        let m = try MountFixture("coffer-fs-vis1")
        let r = m.mountPoint
        // Prime the kernel's caches: the listing, a negative entry, an open-and-read file.
        #expect(writeFile(r + "/seen.txt", "version one") == 0)
        #expect(names(r) == ["seen.txt"])
        #expect(lstatOf(r + "/new.txt") == nil)
        #expect(text(readFile(r + "/seen.txt")) == "version one")
        let held = open(r + "/seen.txt", O_RDONLY | O_CLOEXEC)
        #expect(text(readAll(fd: held)) == "version one")
        close(held)

        // write: a new file and new content for a cached one
        #expect(coffer(m.dataDir, ["write", "/new.txt"], stdin: Array("from the CLI".utf8)).status == 0)
        #expect(eventually(timeout: 1.0) { text(readFile(r + "/new.txt")) == "from the CLI" })
        #expect(
            coffer(m.dataDir, ["write", "/seen.txt"], stdin: Array("version two, longer than one".utf8)).status == 0)
        #expect(eventually(timeout: 1.0) { text(readFile(r + "/seen.txt")) == "version two, longer than one" })
        #expect(statOf(r + "/seen.txt")?.st_size == 28)
        // Same size, different bytes: the page cache must not keep the old pages.
        #expect(
            coffer(m.dataDir, ["write", "/seen.txt"], stdin: Array("VERSION TWO, LONGER THAN ONE".utf8)).status == 0)
        #expect(eventually(timeout: 1.0) { text(readFile(r + "/seen.txt")) == "VERSION TWO, LONGER THAN ONE" })
        #expect(eventually(timeout: 1.0) { names(r) == ["seen.txt", "new.txt"] })

        // mkdir
        #expect(coffer(m.dataDir, ["mkdir", "-p", "/made/deeper"]).status == 0)
        #expect(eventually(timeout: 1.0) { statOf(r + "/made/deeper").map { $0.st_mode & S_IFMT } == S_IFDIR })
        #expect(eventually(timeout: 1.0) { names(r) == ["seen.txt", "new.txt", "made"] })

        // mv: the old name goes, the new one comes, with the content
        #expect(lstatOf(r + "/new.txt") != nil)
        #expect(coffer(m.dataDir, ["mv", "/new.txt", "/made/deeper/moved.txt"]).status == 0)
        #expect(
            eventually(timeout: 1.0) {
                lstatOf(r + "/new.txt") == nil && text(readFile(r + "/made/deeper/moved.txt")) == "from the CLI"
            })
        #expect(
            eventually(timeout: 1.0) { names(r) == ["seen.txt", "made"] && names(r + "/made/deeper") == ["moved.txt"] })

        // rm
        #expect(coffer(m.dataDir, ["rm", "/seen.txt"]).status == 0)
        #expect(
            eventually(timeout: 1.0) {
                lstatOf(r + "/seen.txt") == nil && openErrno(r + "/seen.txt", O_RDONLY) == ENOENT
            })
        #expect(coffer(m.dataDir, ["rm", "-r", "/made"]).status == 0)
        #expect(
            eventually(timeout: 1.0) { lstatOf(r + "/made/deeper/moved.txt") == nil && lstatOf(r + "/made") == nil })
        #expect(eventually(timeout: 1.0) { names(r).isEmpty })
    }

    @Test func mountChangesAppearInTheCLI() throws {
        let m = try MountFixture("coffer-fs-vis2")
        let r = m.mountPoint
        func cli(_ args: String...) -> ProcessResult { coffer(m.dataDir, args) }

        // The daemon commits in groups (docs/STORE.md): what it did reaches other processes
        // within the group's window (50 ms), well inside the promised second; fsync at once.
        #expect(writeFile(r + "/a.txt", "written in the mount") == 0)
        #expect(eventually(timeout: 1.0) { cli("cat", "/a.txt").out == "written in the mount" })
        // Written but not yet closed content is not promised; after close it is there.
        let fd = open(r + "/a.txt", O_WRONLY | O_TRUNC | O_CLOEXEC)
        #expect(write(fd, "second", 6) == 6)
        #expect(fsync(fd) == 0)
        #expect(cli("cat", "/a.txt").out == "second", "fsync commits at once")
        #expect(close(fd) == 0)
        let big = pseudoRandomBytes(count: 5_000_000, seed: 11)
        #expect(writeFile(r + "/big.bin", big) == 0)
        #expect(eventually(timeout: 1.0) { cli("cat", "/big.bin").stdout == big })

        #expect(mkdir(r + "/dir", 0o755) == 0)
        #expect(
            eventually(timeout: 1.0) {
                cli("ls", "/").out.split(separator: "\n").sorted() == ["a.txt", "big.bin", "dir/"]
            })
        #expect(rename(r + "/a.txt", r + "/dir/b.txt") == 0)
        #expect(eventually(timeout: 1.0) { cli("ls", "/dir").out == "b.txt\n" })
        #expect(cli("cat", "/dir/b.txt").out == "second")
        #expect(cli("cat", "/a.txt").status != 0)
        #expect(unlink(r + "/dir/b.txt") == 0)
        #expect(rmdir(r + "/dir") == 0)
        #expect(eventually(timeout: 1.0) { cli("ls", "/").out == "big.bin\n" })
        #expect(cli("fsck").status == 0)

        // And back: the CLI's change over the mount's.
        #expect(cli("write", "/big.bin").status == 0)
        #expect(eventually(timeout: 1.0) { statOf(r + "/big.bin")?.st_size == 0 && readFile(r + "/big.bin") == [] })
    }
}
