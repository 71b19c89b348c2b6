# Install rules and the .deb packages (CPack, one package per component; scripts/package).
#   ddpctl      ddpctl, ddp-ncclid (found beside ddpctl), man page, bash completion
#   ddp-agentd  ddp-agentd, its systemd unit, the default /etc/ddpctl/agent.yaml (a conffile)
# Depends come from dpkg-shlibdeps over the installed binaries, so they name exactly the
# Debian library packages (and versions) the build linked against.
include(GNUInstallDirs)

install(TARGETS ddpctl ddp-ncclid RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT ddpctl)
install(TARGETS ddp-agentd RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT agentd)
install(FILES ${CMAKE_SOURCE_DIR}/packaging/systemd/ddp-agentd.service DESTINATION lib/systemd/system COMPONENT agentd)
install(FILES ${CMAKE_SOURCE_DIR}/packaging/agent.yaml DESTINATION /etc/ddpctl COMPONENT agentd)

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME ddpctl)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "ddpctl maintainers <ddpctl@localhost>")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_COMPONENTS_ALL ddpctl agentd)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "https://example.invalid/ddpctl")

set(CPACK_DEBIAN_DDPCTL_PACKAGE_NAME ddpctl)
# One string each (a CMake list would put ';' between the lines): summary, then the long text.
set(CPACK_COMPONENT_DDPCTL_DESCRIPTION "launcher and supervisor for PyTorch DDP / NCCL training jobs
ddpctl launches a job's workers with torchrun's environment contract, serves the
TCPStore, streams logs, names the first failure, restarts, and leaves nothing running.
With --nodes it drives ddp-agentd on every node over an authenticated protocol.")
set(CPACK_DEBIAN_AGENTD_PACKAGE_NAME ddp-agentd)
set(CPACK_COMPONENT_AGENTD_DESCRIPTION "ddpctl node agent (systemd service)
ddp-agentd runs on every GPU node and runs a job's workers there for an authenticated
ddpctl coordinator. Configure /etc/ddpctl/agent.yaml and /etc/ddpctl/token, then
systemctl enable --now ddp-agentd.")
set(CPACK_DEBIAN_AGENTD_PACKAGE_CONTROL_EXTRA
    ${CMAKE_SOURCE_DIR}/packaging/deb/agentd/conffiles ${CMAKE_SOURCE_DIR}/packaging/deb/agentd/postinst
    ${CMAKE_SOURCE_DIR}/packaging/deb/agentd/prerm ${CMAKE_SOURCE_DIR}/packaging/deb/agentd/postrm)
set(CPACK_DEBIAN_AGENTD_PACKAGE_CONTROL_STRICT_PERMISSION ON)

include(CPack)
