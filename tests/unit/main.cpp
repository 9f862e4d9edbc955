// tests/unit/main.cpp: the Catch2 main for all unit tests (tests/unit/*.cpp).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
