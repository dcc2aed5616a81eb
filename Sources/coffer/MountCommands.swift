import ArgumentParser
import CofferVault
import Foundation

struct Mount: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Mount the tree with FUSE.")
    @OptionGroup var store: StoreOptions
    @Argument var mountPoint: String

    func run() throws {
        try guarded { throw CLIError("mount is not available yet") }
    }
}

struct Unmount: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Unmount a mounted tree.")
    @Argument var mountPoint: String

    func run() throws {
        try guarded { throw CLIError("mount is not available yet") }
    }
}
